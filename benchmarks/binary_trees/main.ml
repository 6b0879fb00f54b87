(* binary-trees: a stretch tree, a long-lived tree, then many short-lived trees per depth. *)

let () =
  let max_depth = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 10 in
  let min_depth = 4 in
  let max_depth = max (min_depth + 2) max_depth in
  let stretch = max_depth + 1 in
  Printf.printf "stretch tree of depth %d\t check: %d\n" stretch (Tree.check (Tree.make stretch));
  let long_lived = Tree.make max_depth in
  let grand = ref 0 in
  let d = ref min_depth in
  while !d <= max_depth do
    let iters = 1 lsl (max_depth - !d + min_depth) in
    let c = Counter.make () in
    Counter.iterate iters (fun i ->
        let t = Tree.make !d in
        let k = Tree.check t in
        (* every 64th tree is also walked by the generic fold *)
        if i land 63 = 0 then c.Counter.add (k + Tree.leaves t - Tree.height t) else c.Counter.add k);
    grand := !grand + c.Counter.total ();
    Printf.printf "%d\t trees of depth %d\t check: %d\n" (c.Counter.count ()) !d (c.Counter.total ());
    d := !d + 2
  done;
  Printf.printf "long lived tree of depth %d\t check: %d\n" max_depth (Tree.check long_lived);
  Printf.printf "grand total %d\n" !grand
