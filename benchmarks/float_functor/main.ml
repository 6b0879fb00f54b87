(* Chebyshev polynomials, their roots by Newton, and conjugate gradient on a 1-D
   Laplacian, all through functors instantiated at floats; plus the same polynomial
   code at integers modulo a prime. *)

module P = Poly.Make (Field.Float)
module V = Vspace.Make (Field.Float)
module F7 = Field.Modp (struct let p = 1_000_003 end)
module Pm = Poly.Make (F7)

let chebyshev n =
  let two_x = P.scale 2. P.x in
  let rec go k prev cur = if k = n then cur else go (k + 1) cur (P.sub (P.mul two_x cur) prev) in
  if n = 0 then P.const 1. else go 1 (P.const 1.) P.x

let () =
  let reps = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 10 in
  let deg = 24 in
  let root_err = ref 0. and cg_sum = ref 0. and cg_iters = ref 0 and modsum = ref 0 in
  for r = 1 to reps do
    (* roots of T_deg are cos((2k-1) pi / 2deg) *)
    let t = chebyshev deg in
    for k = 1 to deg do
      let exact = cos (float ((2 * k) - 1) *. Float.pi /. float (2 * deg)) in
      let x = P.newton_root t (exact +. (0.01 /. float deg)) 30 in
      root_err := Float.max !root_err (Float.abs (x -. exact))
    done;
    (* tridiagonal SPD system (2 + 1/r) on the diagonal, -1 off it *)
    let n = 200 in
    let d = 2. +. (1. /. float r) in
    let apply v =
      Array.init n (fun i ->
        let left = if i > 0 then v.(i - 1) else 0. and right = if i < n - 1 then v.(i + 1) else 0. in
        (d *. v.(i)) -. left -. right)
    in
    let b = Array.init n (fun i -> float ((i * 37 mod 11) - 5)) in
    let x, it = V.conjugate_gradient ~apply ~b ~iters:(2 * n) ~tol:1e-20 in
    cg_sum := !cg_sum +. V.dot x x;
    cg_iters := !cg_iters + it;
    (* modular: (x + r)^40 evaluated two ways *)
    let base = [| F7.of_int r; F7.one |] in
    let rec power p e = if e = 0 then Pm.const F7.one else Pm.mul p (power p (e - 1)) in
    let q = power base 40 in
    let v = F7.of_int (r * 7919) in
    let direct = Pm.eval q v in
    let rec fpow a e = if e = 0 then F7.one else F7.mul a (fpow a (e - 1)) in
    let check = fpow (F7.add v (F7.of_int r)) 40 in
    if direct <> check then print_endline "modular mismatch";
    modsum := (!modsum + Pm.eval (Pm.deriv q) v) mod 1_000_003
  done;
  Printf.printf "reps %d\n" reps;
  Printf.printf "max root error %.3e\n" !root_err;
  Printf.printf "cg: %d iterations, sum |x|^2 = %.6f\n" !cg_iters !cg_sum;
  Printf.printf "modular checksum %d\n" !modsum
