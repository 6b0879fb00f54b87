(* Tallies of checked trees, as a record of closures over private state. *)

type t = { add : int -> unit; total : unit -> int; count : unit -> int }

let make () =
  let sum = ref 0 and n = ref 0 in
  { add = (fun x -> sum := !sum + x; incr n);
    total = (fun () -> !sum);
    count = (fun () -> !n) }

let iterate n f = for i = 1 to n do f i done
