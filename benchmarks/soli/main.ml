(* Solves complement problems of English peg solitaire (start with one empty hole,
   finish with a single peg in it). Each argument is one instance "r/h": the move list
   rotated by 3r (another search order) and the hole h (cell 7*row + col). *)

let () =
  let visited = ref 0 and pruned = ref 0 and solved = ref 0 in
  let instances = List.tl (Array.to_list Sys.argv) in
  List.iter
    (fun spec ->
      let r, hole = Scanf.sscanf spec "%d/%d" (fun r h -> (r, h)) in
      let b = Board.rotated Board.english (3 * r) in
      let start = Board.full b lxor Board.bit hole in
      let res, st = Solver.solve b ~start ~target:hole in
      visited := !visited + st.Solver.visited;
      pruned := !pruned + st.Solver.pruned;
      match res with
      | Some path ->
        incr solved;
        if List.length path <> Board.pegs start - 1 then print_endline "bad length";
        let h = List.fold_left (fun h (a, o, c) -> ((h * 131) + (a * 2401) + (o * 49) + c) land 0x3fffffff) 0 path in
        let a, _, c = List.hd path in
        Printf.printf "%s: solved in %d jumps after %d positions, first jump %d->%d, hash %d\n" spec
          (List.length path) st.Solver.visited a c h
      | None -> Printf.printf "%s: no solution after %d positions\n" spec st.Solver.visited)
    instances;
  Printf.printf "%d of %d solved, %d positions visited, %d pruned\n" !solved (List.length instances) !visited !pruned
