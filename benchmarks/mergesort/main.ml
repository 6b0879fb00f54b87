(* Sorts pseudo-random data of several types with the merge sort functor, on arrays
   and on lists, and checks both agree. Arguments: element count, rounds. *)

let seed = ref 42
let next () =
  seed := (!seed * 25214903917 + 11) land 0xffffffffffff;
  !seed lsr 16

module Point = struct
  type t = { x : int; y : float }
end

module IntS = Msort.Make (Ord.Int_asc)
module IntDesc = Msort.Make (Ord.Rev (Ord.Int_asc))
module FloatS = Msort.Make (Ord.Float_asc)
module PairS = Msort.Make (Ord.Lex (Ord.Int_asc) (Ord.Rev (Ord.Float_asc)))
module PointS = Msort.Make (Ord.By (Ord.Float_asc) (struct type t = Point.t let key p = p.Point.y end))

let checks = ref 0
let check name b = if b then incr checks else Printf.printf "%s: FAILED\n" name

(* position-weighted checksum of a sorted int sequence *)
let weigh f a = fst (Array.fold_left (fun (s, i) v -> ((s + (i * f v)) land 0x3fffffff, i + 1)) (0, 1) a)

let () =
  let n = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 10000 in
  let rounds = if Array.length Sys.argv > 2 then int_of_string Sys.argv.(2) else 1 in
  let total = ref 0 in
  for _ = 1 to rounds do
    let ints = Array.init n (fun _ -> next () mod (n * 4)) in
    let l = Array.to_list ints in
    let a = Array.copy ints in
    IntS.sort_array a;
    let sl = IntS.sort_list l in
    check "ints" (IntS.is_sorted_array a && Array.to_list a = sl);
    let d = Array.copy ints in
    IntDesc.sort_array d;
    check "desc" (IntDesc.is_sorted_array d && d.(0) = a.(n - 1));
    let fl = Array.map (fun i -> float i /. 7.) ints in
    FloatS.sort_array fl;
    check "floats" (FloatS.is_sorted_array fl);
    let pairs = Array.init n (fun i -> (ints.(i) mod 97, fl.(n - 1 - i))) in
    let pl = PairS.sort_list (Array.to_list pairs) in
    PairS.sort_array pairs;
    check "pairs" (PairS.is_sorted_list pl && Array.to_list pairs = pl);
    let pts = Array.init n (fun i -> { Point.x = i; y = float (ints.(i) mod 1000) }) in
    PointS.sort_array pts;
    (* stability: equal keys keep increasing original positions *)
    let stable = ref true in
    for i = 1 to n - 1 do
      if pts.(i).Point.y = pts.(i - 1).Point.y && pts.(i).Point.x < pts.(i - 1).Point.x then stable := false
    done;
    check "stable" (PointS.is_sorted_array pts && !stable);
    total :=
      (!total + weigh (fun v -> v) a + weigh (fun (k, _) -> k) pairs + weigh (fun p -> p.Point.x) pts) land 0x3fffffff
  done;
  Printf.printf "n %d rounds %d checks passed %d\n" n rounds !checks;
  Printf.printf "checksum %d\n" !total
