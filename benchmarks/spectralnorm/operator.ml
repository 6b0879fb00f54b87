(* Linear operators as first-class modules: a dimension and an [apply src dst]. *)

module type OP = sig
  val dim : int
  val apply : float array -> float array -> unit
end

type t = (module OP)

(* The infinite matrix A of the problem, truncated to n x n, given by its entry function. *)
let entry i j = 1. /. float_of_int ((((i + j) * (i + j + 1)) / 2) + i + 1)

let of_entries n (a : int -> int -> float) : t =
  (module struct
    let dim = n
    let apply src dst =
      for i = 0 to n - 1 do
        let s = ref 0. in
        for j = 0 to n - 1 do s := !s +. (a i j *. Array.unsafe_get src j) done;
        Array.unsafe_set dst i !s
      done
  end)

let matrix n = of_entries n entry
let transpose n = of_entries n (fun i j -> entry j i)

(* [compose f g] applies g, then f. *)
let compose (f : t) (g : t) : t =
  let module F = (val f) in
  let module G = (val g) in
  (module struct
    let dim = G.dim
    let tmp = Array.make G.dim 0.
    let apply src dst = G.apply src tmp; F.apply tmp dst
  end)

let apply (op : t) src dst = let module O = (val op) in O.apply src dst
