(* N-queens on lists: a partial solution is the list of the columns of the queens
   placed so far, most recent first; solutions are produced as a lazy sequence. *)

let attacks col placed =
  let rec go dist = function
    | [] -> false
    | c :: rest -> c = col || abs (c - col) = dist || go (dist + 1) rest
  in
  go 1 placed

let range n = List.init n (fun i -> i)

let rec solutions n row placed : int list Seq.t =
  if row = n then Seq.return placed
  else
    Seq.flat_map
      (fun col -> if attacks col placed then Seq.empty else solutions n (row + 1) (col :: placed))
      (List.to_seq (range n))

let count n = Seq.fold_left (fun k _ -> k + 1) 0 (solutions n 0 [])

(* the first solution in lexicographic order of columns, row 0 first *)
let first n = match solutions n 0 [] () with Seq.Nil -> None | Seq.Cons (s, _) -> Some (List.rev s)

(* solutions equal to their own reflection through the vertical axis never exist for
   n > 1; count the ones symmetric under a half turn instead *)
let half_turn_symmetric n =
  Seq.fold_left
    (fun k s ->
      let a = Array.of_list (List.rev s) in
      let ok = ref true in
      Array.iteri (fun r c -> if a.(n - 1 - r) <> n - 1 - c then ok := false) a;
      if !ok then k + 1 else k)
    0 (solutions n 0 [])
