(* Nelson-Siegel yield curve: y(t) = b0 + b1 g(t/tau) + b2 (g(t/tau) - exp(-t/tau)),
   with g(u) = (1 - exp(-u)) / u. Parameters are [| b0; b1; b2; tau |]. *)

let yield p t =
  let u = t /. p.(3) in
  let e = exp (-.u) in
  let g = if u < 1e-8 then 1. -. (0.5 *. u) else (1. -. e) /. u in
  p.(0) +. (p.(1) *. g) +. (p.(2) *. (g -. e))

let fit ~maturities ~yields ~p0 ~iters =
  let residuals p = Array.mapi (fun i t -> yield p t -. yields.(i)) maturities in
  Solver.levenberg_marquardt ~residuals ~p0 ~iters
