(* Problems encoded as BDDs: n-queens, and equivalence of two adder circuits. *)

let queens n =
  let v i j = Bdd.var ((i * n) + j) in
  let cells = List.init n (fun i -> List.init n (fun j -> (i, j))) |> List.concat in
  let attacks (i, j) (k, l) = (i, j) <> (k, l) && (i = k || j = l || abs (i - k) = abs (j - l)) in
  let cell_constraint (i, j) =
    let others = List.filter (attacks (i, j)) cells in
    Bdd.imp (v i j) (Bdd.conj_list (List.map (fun (k, l) -> Bdd.neg (v k l)) others))
  in
  let row_has_queen i = Bdd.disj_list (List.init n (fun j -> v i j)) in
  let b = Bdd.conj_list (List.init n row_has_queen) in
  let b = List.fold_left (fun acc c -> Bdd.conj acc (cell_constraint c)) b cells in
  Bdd.sat_count (n * n) b

(* w-bit adders over interleaved inputs a_i = var 2i, b_i = var 2i+1 *)
let ripple_adder w =
  let a i = Bdd.var (2 * i) and b i = Bdd.var ((2 * i) + 1) in
  let rec go i carry acc =
    if i = w then List.rev (carry :: acc)
    else
      let s = Bdd.xor (Bdd.xor (a i) (b i)) carry in
      let c = Bdd.disj (Bdd.conj (a i) (b i)) (Bdd.conj carry (Bdd.xor (a i) (b i))) in
      go (i + 1) c (s :: acc)
  in
  go 0 Bdd.False []

let lookahead_adder w =
  let a i = Bdd.var (2 * i) and b i = Bdd.var ((2 * i) + 1) in
  let g i = Bdd.conj (a i) (b i) and p i = Bdd.disj (a i) (b i) in
  (* carry into bit i: OR over j < i of g j AND p (j+1) ... p (i-1) *)
  let carry i =
    Bdd.disj_list
      (List.init i (fun j -> Bdd.conj_list (g j :: List.init (i - j - 1) (fun k -> p (j + k + 1)))))
  in
  List.init (w + 1) (fun i ->
    if i = w then carry w else Bdd.xor (Bdd.xor (a i) (b i)) (carry i))

let adders_equivalent w =
  let r = ripple_adder w and l = lookahead_adder w in
  Bdd.conj_list (List.map2 Bdd.iff r l) == Bdd.True
