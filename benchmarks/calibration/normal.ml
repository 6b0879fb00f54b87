(* Standard normal distribution: density, and the CDF from the error function, which is
   summed as a Taylor series near zero and as a continued fraction in the tails. *)

let inv_sqrt_2pi = 1. /. sqrt (2. *. Float.pi)
let pdf x = inv_sqrt_2pi *. exp (-0.5 *. x *. x)

let erf_series x =
  (* erf x = 2/sqrt(pi) * sum_n (-1)^n x^(2n+1) / (n! (2n+1)) *)
  let x2 = x *. x in
  let rec go n term acc =
    let contrib = term /. float ((2 * n) + 1) in
    if Float.abs contrib < 1e-17 *. Float.abs acc || n > 200 then acc +. contrib
    else go (n + 1) (-.term *. x2 /. float (n + 1)) (acc +. contrib)
  in
  2. /. sqrt Float.pi *. go 0 x 0.

let erfc_cf x =
  (* for x > 0: erfc x = exp(-x^2)/sqrt(pi) / (x + (1/2)/(x + 1/(x + (3/2)/(x + ...)))) *)
  let rec frac k acc = if k = 0 then acc else frac (k - 1) (float k /. 2. /. (x +. acc)) in
  exp (-.x *. x) /. sqrt Float.pi /. (x +. frac 60 0.)

let erfc x =
  if Float.abs x < 2.5 then 1. -. erf_series x
  else if x > 0. then erfc_cf x
  else 2. -. erfc_cf (-.x)

let cdf x = 0.5 *. erfc (-.x /. sqrt 2.)
