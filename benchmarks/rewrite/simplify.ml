(* Algebraic simplification as a list of local rewrite rules (partial functions),
   applied bottom-up until nothing changes. *)
open Expr

type rule = Expr.t -> Expr.t option

let rules : rule list =
  [ (function Add (Num 0, e) | Add (e, Num 0) -> Some e | _ -> None);
    (function Mul (Num 0, _) | Mul (_, Num 0) -> Some (Num 0) | _ -> None);
    (function Mul (Num 1, e) | Mul (e, Num 1) -> Some e | _ -> None);
    (function Add (Num a, Num b) -> Some (Num (a + b)) | _ -> None);
    (function Mul (Num a, Num b) -> Some (Num (a * b)) | _ -> None);
    (function Neg (Num a) -> Some (Num (-a)) | Neg (Neg e) -> Some e | _ -> None);
    (function Pow (_, 0) -> Some (Num 1) | Pow (e, 1) -> Some e | _ -> None);
    (function Pow (Pow (e, a), b) -> Some (Pow (e, a * b)) | _ -> None);
    (* constants to the left, and gather constant factors *)
    (function Mul (e, (Num _ as n)) -> Some (Mul (n, e)) | _ -> None);
    (function Mul (Num a, Mul (Num b, e)) -> Some (Mul (Num (a * b), e)) | _ -> None);
    (function Mul (Neg a, b) -> Some (Neg (Mul (a, b))) | Mul (a, Neg b) -> Some (Neg (Mul (a, b))) | _ -> None);
    (function Add (a, Neg b) when a = b -> Some (Num 0) | _ -> None);
    (function Add (a, b) when a = b -> Some (Mul (Num 2, a)) | _ -> None);
    (function Mul (a, b) when a = b -> Some (Pow (a, 2)) | _ -> None);
    (function Mul (Pow (a, k), b) when a = b -> Some (Pow (a, k + 1)) | _ -> None);
    (function Mul (Pow (a, j), Pow (b, k)) when a = b -> Some (Pow (a, j + k)) | _ -> None);
    (function Mul (Exp a, Exp b) -> Some (Exp (Add (a, b))) | _ -> None);
    (function Ln (Exp a) -> Some a | Exp (Ln a) -> Some a | _ -> None);
  ]

let first_match rules e =
  let rec go = function [] -> None | r :: rest -> ( match r e with Some _ as s -> s | None -> go rest) in
  go rules

(* bottom-up, re-simplifying any node a rule rewrote *)
let rec bottom_up rules e =
  let e = map_children (bottom_up rules) e in
  match first_match rules e with Some e' -> bottom_up rules e' | None -> e

let simplify e =
  let rec fix e n =
    let e' = bottom_up rules e in
    if e' = e || n = 0 then e' else fix e' (n - 1)
  in
  fix e 10
