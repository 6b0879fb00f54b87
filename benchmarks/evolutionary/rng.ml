(* SplitMix64 generator on Int64 (wrapping arithmetic), with derived draws. *)

type t = { mutable state : int64 }

let make seed = { state = Int64.of_int seed }

let next g =
  g.state <- Int64.add g.state 0x9E3779B97F4A7C15L;
  let z = g.state in
  let z = Int64.mul (Int64.logxor z (Int64.shift_right_logical z 30)) 0xBF58476D1CE4E5B9L in
  let z = Int64.mul (Int64.logxor z (Int64.shift_right_logical z 27)) 0x94D049BB133111EBL in
  Int64.logxor z (Int64.shift_right_logical z 31)

(* uniform in [0, 1) from the top 53 bits *)
let float g = Int64.to_float (Int64.shift_right_logical (next g) 11) *. 0x1p-53

(* uniform in [0, n) *)
let int g n = Int64.to_int (Int64.unsigned_rem (next g) (Int64.of_int n))

let bool g = Int64.compare (next g) 0L < 0

(* standard normal by the Box-Muller transform (one of the pair is discarded) *)
let gaussian g =
  let u1 = 1. -. float g and u2 = float g in
  sqrt (-2. *. log u1) *. cos (2. *. Float.pi *. u2)
