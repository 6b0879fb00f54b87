(* Random directed graphs with integer weights as adjacency matrices (arrays of rows). *)

type t = { n : int; w : int option array array }

let generate ~n ~degree ~seed =
  let st = ref seed in
  let rnd bound = st := ((!st * 1103515245) + 12345) land 0x7fffffff; (!st lsr 4) mod bound in
  let w = Array.make_matrix n n None in
  for u = 0 to n - 1 do
    for _ = 1 to degree do
      let v = rnd n in
      if v <> u then w.(u).(v) <- Some (1 + rnd 100)
    done;
    (* a sparse backbone: every vertex but the last few links to the next *)
    if u + 1 < n && u mod 17 <> 0 then w.(u).(u + 1) <- Some (50 + rnd 50)
  done;
  { n; w }

let edge g u v = g.w.(u).(v)
