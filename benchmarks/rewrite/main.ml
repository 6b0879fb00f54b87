(* Repeatedly differentiates a few functions, simplifying after every step, and
   evaluates the results at sample points. *)
open Expr

let functions =
  [ ("x sin(x) exp(x)", Mul (X, Mul (Sin X, Exp X)));
    ("exp(x^2) / (1+x^2)", Mul (Exp (Pow (X, 2)), Pow (Add (Num 1, Pow (X, 2)), -1)));
    ("ln(1+x^2) cos(3x)", Mul (Ln (Add (Num 1, Pow (X, 2))), Cos (Mul (Num 3, X))));
    ("(x^3 - 2x + 5)^4", Pow (Add (Pow (X, 3), Add (Neg (Mul (Num 2, X)), Num 5)), 4)) ]

let () =
  let order = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 4 in
  let reps = if Array.length Sys.argv > 2 then int_of_string Sys.argv.(2) else 1 in
  let total = ref 0 in
  let report = ref [] in
  for _ = 1 to reps do
    report :=
      List.map
        (fun (name, f) ->
          let rec go k e raw_size =
            if k = 0 then (e, raw_size)
            else
              let de = Deriv.d e in
              go (k - 1) (Simplify.simplify de) (raw_size + size de)
          in
          let e, raw = go order f 0 in
          total := !total + size e;
          (name, size e, raw, eval 0.5 e, eval 1.25 e))
        functions
  done;
  List.iter
    (fun (name, sz, raw, a, b) ->
      Printf.printf "d^%d/dx^%d %s: size %d (unsimplified steps %d), at 0.5: %.6e, at 1.25: %.6e\n" order
        order name sz raw a b)
    !report;
  Printf.printf "total size %d\n" !total
