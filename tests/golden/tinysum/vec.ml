(* A few small functions for the inliner to decide about. *)
let square x = x * x
let add a b = a + b
let fold f init n =
  let rec go acc i = if i > n then acc else go (f acc i) (i + 1) in
  go init 1
let sum_squares n = fold (fun acc i -> add acc (square i)) 0 n
