(* Takeuchi's function in several calling styles. *)

(* curried, on ints *)
let rec tak x y z = if y < x then tak (tak (x - 1) y z) (tak (y - 1) z x) (tak (z - 1) x y) else z

(* uncurried: the arguments travel as one tuple *)
let rec tak_tuple (x, y, z) =
  if y < x then tak_tuple (tak_tuple (x - 1, y, z), tak_tuple (y - 1, z, x), tak_tuple (z - 1, x, y)) else z

(* over any ordered type with a predecessor *)
module type NUM = sig
  type t
  val lt : t -> t -> bool
  val pred : t -> t
end

module Make (N : NUM) = struct
  let rec tak x y z = if N.lt y x then tak (tak (N.pred x) y z) (tak (N.pred y) z x) (tak (N.pred z) x y) else z
end

module Float_tak = Make (struct
  type t = float
  let lt (a : float) b = a < b
  let pred x = x -. 1.
end)

(* continuation-passing style *)
let tak_cps x y z =
  let rec go x y z k =
    if y < x then go (x - 1) y z (fun a -> go (y - 1) z x (fun b -> go (z - 1) x y (fun c -> go a b c k))) else k z
  in
  go x y z (fun r -> r)
