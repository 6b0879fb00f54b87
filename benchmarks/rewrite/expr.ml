(* Symbolic expressions in one variable, with evaluation, size and printing. *)

type t =
  | Num of int
  | X
  | Add of t * t
  | Mul of t * t
  | Neg of t
  | Pow of t * int
  | Sin of t
  | Cos of t
  | Exp of t
  | Ln of t

(* rebuild a node from transformed children: the generic traversal used everywhere *)
let map_children f = function
  | (Num _ | X) as e -> e
  | Add (a, b) -> Add (f a, f b)
  | Mul (a, b) -> Mul (f a, f b)
  | Neg a -> Neg (f a)
  | Pow (a, k) -> Pow (f a, k)
  | Sin a -> Sin (f a)
  | Cos a -> Cos (f a)
  | Exp a -> Exp (f a)
  | Ln a -> Ln (f a)

let fold_children f acc = function
  | Num _ | X -> acc
  | Add (a, b) | Mul (a, b) -> f (f acc a) b
  | Neg a | Pow (a, _) | Sin a | Cos a | Exp a | Ln a -> f acc a

let rec size e = fold_children (fun s c -> s + size c) 1 e

let rec eval x = function
  | Num n -> float n
  | X -> x
  | Add (a, b) -> eval x a +. eval x b
  | Mul (a, b) -> eval x a *. eval x b
  | Neg a -> -.eval x a
  | Pow (a, k) -> Float.pow (eval x a) (float k)
  | Sin a -> sin (eval x a)
  | Cos a -> cos (eval x a)
  | Exp a -> exp (eval x a)
  | Ln a -> log (eval x a)

let rec to_string = function
  | Num n -> string_of_int n
  | X -> "x"
  | Add (a, b) -> "(" ^ to_string a ^ " + " ^ to_string b ^ ")"
  | Mul (a, b) -> to_string a ^ "*" ^ to_string b
  | Neg a -> "-" ^ to_string a
  | Pow (a, k) -> to_string a ^ "^" ^ string_of_int k
  | Sin a -> "sin(" ^ to_string a ^ ")"
  | Cos a -> "cos(" ^ to_string a ^ ")"
  | Exp a -> "exp(" ^ to_string a ^ ")"
  | Ln a -> "ln(" ^ to_string a ^ ")"
