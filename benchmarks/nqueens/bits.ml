(* N-queens by backtracking over bit masks: one bit per column, the diagonals shifted
   one place per row. *)

let lowest b = b land (-b)
let without_lowest b = b land (b - 1)
let popcount b = let rec go b n = if b = 0 then n else go (without_lowest b) (n + 1) in go b 0

(* calls [f] on each free square of [free], lowest column first, folding an int *)
let rec fold_bits f free acc = if free = 0 then acc else fold_bits f (without_lowest free) (f (lowest free) acc)

let count n =
  let full = (1 lsl n) - 1 in
  let rec place cols left right =
    if cols = full then 1
    else
      let free = full land lnot (cols lor left lor right) in
      fold_bits (fun bit acc -> acc + place (cols lor bit) ((left lor bit) lsl 1) ((right lor bit) lsr 1)) free 0
  in
  place 0 0 0

(* solutions with the first-row queen in each column, which sum to [count n] *)
let by_first_column n =
  let full = (1 lsl n) - 1 in
  let rec place cols left right =
    if cols = full then 1
    else
      fold_bits (fun bit acc -> acc + place (cols lor bit) ((left lor bit) lsl 1) ((right lor bit) lsr 1))
        (full land lnot (cols lor left lor right)) 0
  in
  Array.init n (fun c -> let bit = 1 lsl c in place bit (bit lsl 1) (bit lsr 1))
