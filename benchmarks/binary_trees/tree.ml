(* Perfect binary trees built bottom-up and walked by small recursive helpers. *)

type t = Leaf | Node of t * t

let node l r = Node (l, r)

let rec make depth = if depth <= 0 then node Leaf Leaf else node (make (depth - 1)) (make (depth - 1))

(* number of nodes reached, counting each Node once *)
let rec check = function Leaf -> 0 | Node (l, r) -> 1 + check l + check r

(* generic fold: [leaf] for empty subtrees, [join] combines the two children *)
let rec fold ~leaf ~join = function
  | Leaf -> leaf
  | Node (l, r) -> join (fold ~leaf ~join l) (fold ~leaf ~join r)

let height t = fold ~leaf:0 ~join:(fun a b -> 1 + max a b) t
let leaves t = fold ~leaf:1 ~join:( + ) t
