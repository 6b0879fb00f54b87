(* Constraint strengths, strongest first. *)

type t = Required | Strong_preferred | Preferred | Strong_default | Normal | Weak_default | Weakest

let rank = function
  | Required -> 0 | Strong_preferred -> 1 | Preferred -> 2 | Strong_default -> 3
  | Normal -> 4 | Weak_default -> 5 | Weakest -> 6

let stronger a b = rank a < rank b
let weaker a b = rank a > rank b
let weakest a b = if weaker a b then a else b

let next_weaker = function
  | Required -> Strong_preferred | Strong_preferred -> Preferred | Preferred -> Strong_default
  | Strong_default -> Normal | Normal -> Weak_default | Weak_default | Weakest -> Weakest
