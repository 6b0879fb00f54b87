(* k-mer counting in a hash table keyed by packed 2-bit codes. *)

module Key = struct
  type t = int
  let equal (a : int) b = a = b
  let hash (k : int) = (k * 0x9E3779B1) lxor (k lsr 17)
end

module Tbl = Hashtbl.Make (Key)

(* Calls [f key] for every window of length [k], the key rolled one letter at a time. *)
let iter_windows s k f =
  let mask = (1 lsl (2 * k)) - 1 in
  let key = ref 0 in
  for i = 0 to String.length s - 1 do
    key := ((!key lsl 2) lor Dna.code (String.unsafe_get s i)) land mask;
    if i >= k - 1 then f !key
  done

let incr_count tbl key =
  match Tbl.find_opt tbl key with
  | Some r -> incr r
  | None -> Tbl.add tbl key (ref 1)

let count s k =
  let tbl = Tbl.create 4096 in
  iter_windows s k (incr_count tbl);
  tbl

let get tbl key = match Tbl.find_opt tbl key with Some r -> !r | None -> 0

(* (k-mer, count), most frequent first, ties by k-mer. *)
let sorted k tbl =
  Tbl.fold (fun key r acc -> (Dna.decode k key, !r) :: acc) tbl []
  |> List.sort (fun (a, x) (b, y) -> if x <> y then compare y x else compare a b)
