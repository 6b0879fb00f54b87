(* Game of life on a torus under four rules, from the same pseudo-random start.
   Arguments: board side, generations. *)

let seed_board n =
  let b = Board.create n n in
  let s = ref 2463534242 in
  for y = 0 to n - 1 do
    for x = 0 to n - 1 do
      s := (!s * 1103515245 + 12345) land 0x7fffffff;
      if (!s lsr 16) mod 100 < 30 then Board.set b x y 1
    done
  done;
  b

let () =
  let n = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 64 in
  let gens = if Array.length Sys.argv > 2 then int_of_string Sys.argv.(2) else 100 in
  let start = seed_board n in
  Printf.printf "%dx%d torus, %d generations, %d alive at start\n" n n gens (Board.population start);
  let rules : (module Rules.RULE) list = [ (module Rules.Conway); (module Rules.Highlife); (module Rules.Day_night); (module Rules.Maze) ] in
  List.iter
    (fun (module R : Rules.RULE) ->
      let module L = Rules.Run (R) in
      let final, hist = L.evolve start gens in
      let peak = List.fold_left max 0 hist in
      Printf.printf "%-28s alive %d peak %d hash %d\n" R.name (Board.population final) peak (Board.hash final))
    rules
