(* Summation algorithms as accumulators behind one signature; the drivers are functors,
   so the accumulator state (a small float record) only disappears if [add] is inlined. *)

module type ACC = sig
  type t
  val name : string
  val zero : t
  val add : t -> float -> t
  val value : t -> float
end

module Naive : ACC = struct
  type t = float
  let name = "naive"
  let zero = 0.
  let add s x = s +. x
  let value s = s
end

module Kahan : ACC = struct
  type t = { sum : float; c : float }
  let name = "kahan"
  let zero = { sum = 0.; c = 0. }
  let add { sum; c } x =
    let y = x -. c in
    let t = sum +. y in
    { sum = t; c = (t -. sum) -. y }
  let value s = s.sum
end

module Neumaier : ACC = struct
  type t = { sum : float; c : float }
  let name = "neumaier"
  let zero = { sum = 0.; c = 0. }
  let add { sum; c } x =
    let t = sum +. x in
    let c =
      if Float.abs sum >= Float.abs x then c +. ((sum -. t) +. x) else c +. ((x -. t) +. sum)
    in
    { sum = t; c }
  let value s = s.sum +. s.c
end

(* second-order compensation (Klein) *)
module Klein : ACC = struct
  type t = { sum : float; cs : float; ccs : float }
  let name = "klein"
  let zero = { sum = 0.; cs = 0.; ccs = 0. }
  let two_sum a b =
    let t = a +. b in
    let e = if Float.abs a >= Float.abs b then (a -. t) +. b else (b -. t) +. a in
    (t, e)
  let add { sum; cs; ccs } x =
    let sum, c = two_sum sum x in
    let cs, cc = two_sum cs c in
    { sum; cs; ccs = ccs +. cc }
  let value s = s.sum +. (s.cs +. s.ccs)
end

module Driver (A : ACC) = struct
  let name = A.name

  (* sum of f 1 .. f n *)
  let over_fn n f =
    let rec go acc k = if k > n then A.value acc else go (A.add acc (f k)) (k + 1) in
    go A.zero 1

  let over_array a = A.value (Array.fold_left A.add A.zero a)
end

(* pairwise (cascade) summation over an array slice, naive at the leaves *)
let rec pairwise a lo hi =
  if hi - lo <= 16 then begin
    let s = ref 0. in
    for i = lo to hi - 1 do s := !s +. a.(i) done;
    !s
  end
  else
    let mid = (lo + hi) / 2 in
    pairwise a lo mid +. pairwise a mid hi
