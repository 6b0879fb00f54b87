(* Symbolic differentiation with respect to x (no simplification). *)
open Expr

let rec d = function
  | Num _ -> Num 0
  | X -> Num 1
  | Add (a, b) -> Add (d a, d b)
  | Mul (a, b) -> Add (Mul (d a, b), Mul (a, d b))
  | Neg a -> Neg (d a)
  | Pow (a, k) -> Mul (Mul (Num k, Pow (a, k - 1)), d a)
  | Sin a -> Mul (Cos a, d a)
  | Cos a -> Neg (Mul (Sin a, d a))
  | Exp a -> Mul (Exp a, d a)
  | Ln a -> Mul (Pow (a, -1), d a)
