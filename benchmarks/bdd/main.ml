(* Counts n-queens solutions and checks two adder designs equal, with fresh BDD tables
   for every repetition. *)

let () =
  let n = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 6 in
  let reps = if Array.length Sys.argv > 2 then int_of_string Sys.argv.(2) else 1 in
  let solutions = ref 0 and nodes = ref 0 and eq = ref true in
  for _ = 1 to reps do
    Bdd.reset ();
    solutions := Problems.queens n;
    nodes := Bdd.node_count ();
    Bdd.reset ();
    eq := !eq && Problems.adders_equivalent (4 * n)
  done;
  Printf.printf "%d-queens: %d solutions (%d nodes)\n" n !solutions !nodes;
  Printf.printf "%d-bit adders equivalent: %b\n" (4 * n) !eq
