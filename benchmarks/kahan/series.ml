(* Series given as term functions k -> float (k >= 1). *)

type t = { name : string; term : int -> float }

let harmonic =
  { name = "harmonic"; term = (fun k -> 1. /. float k) }

let basel =
  { name = "basel"; term = (fun k -> let x = float k in 1. /. (x *. x)) }

let leibniz =
  { name = "leibniz";
    term = (fun k -> let s = if k land 1 = 1 then 4. else -4. in s /. float ((2 * k) - 1)) }

(* telescoping: sum 1/(k(k+1)) = 1 - 1/(n+1) *)
let telescope =
  { name = "telescope"; term = (fun k -> let x = float k in 1. /. (x *. (x +. 1.))) }

(* large terms that cancel in pairs around small ones: each triple k, k+1, k+2
   (k = 1 mod 3) is big, 3e-3, -big *)
let cancel =
  let big k = 1e8 *. float (1 + (k * 7919 mod 1000)) in
  { name = "cancel";
    term = (fun k ->
      match k mod 3 with 1 -> big k | 2 -> 3e-3 | _ -> -.big (k - 2)) }

let all = [ harmonic; basel; leibniz; telescope; cancel ]
