(* The benchmark's linear congruential generator: seed' = (seed * 3877 + 29573) mod 139968,
   scaled into [0, max). *)

let modulus = 139968
let multiplier = 3877
let increment = 29573

type t = { mutable seed : int }

let create seed = { seed }

let step g = g.seed <- ((g.seed * multiplier) + increment) mod modulus

let next g max =
  step g;
  max *. float_of_int g.seed /. float_of_int modulus
