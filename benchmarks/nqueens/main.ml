(* Counts n-queens solutions by bit-mask backtracking for sizes up to [nb] and by the
   list method for sizes up to [nl], and checks the methods agree. Arguments: nb, nl. *)

let () =
  let nb = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 10 in
  let nl = if Array.length Sys.argv > 2 then int_of_string Sys.argv.(2) else 8 in
  let total = ref 0 in
  let counts = Array.init (nb + 1) (fun n -> if n = 0 || n = nb then 0 else Bits.count n) in
  let cols = Bits.by_first_column nb in
  counts.(nb) <- Array.fold_left ( + ) 0 cols;
  Array.iter (fun c -> total := !total + c) counts;
  Printf.printf "bitmask: %d queens %d solutions, total for 1..%d %d\n" nb counts.(nb) nb !total;
  Printf.printf "by first column: %s\n" (String.concat " " (Array.to_list (Array.map string_of_int cols)));
  let agree = ref true and ltotal = ref 0 in
  for n = 1 to nl do
    let c = Listq.count n in
    ltotal := !ltotal + c;
    if n <= nb && c <> counts.(n) then agree := false
  done;
  Printf.printf "lists: %d queens %d solutions (%d half-turn symmetric), total for 1..%d %d, agree %b\n" nl
    (Listq.count nl) (Listq.half_turn_symmetric nl) nl !ltotal !agree;
  match Listq.first nl with
  | Some s -> Printf.printf "first: %s\n" (String.concat " " (List.map string_of_int s))
  | None -> print_endline "first: none"
