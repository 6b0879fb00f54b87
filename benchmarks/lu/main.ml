(* Decomposes pseudo-random matrices, solves A x = A 1, and reports the error, the
   log-determinant and a checksum. *)

let () =
  let n = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 100 in
  let reps = if Array.length Sys.argv > 2 then int_of_string Sys.argv.(2) else 1 in
  let state = ref 12345 in
  let next () =
    state := ((!state * 1103515245) + 12345) land 0x7fffffff;
    (float (!state lsr 4) /. float (0x7fffffff lsr 4)) -. 0.5
  in
  let worst = ref 0. and logdet = ref 0. and sign = ref 0 and check = ref 0. in
  for _ = 1 to reps do
    let a = Matrix.init n n (fun i j -> next () +. if i = j then 0.1 else 0.) in
    let f = Lu.decompose a in
    let ones = Array.make n 1. in
    let x = Lu.solve f (Matrix.mul_vec a ones) in
    Array.iter (fun xi -> worst := Float.max !worst (Float.abs (xi -. 1.))) x;
    let ld, sg = Lu.log_abs_det f in
    logdet := ld;
    sign := sg;
    check := !check +. Array.fold_left ( +. ) 0. (Lu.solve f ones)
  done;
  Printf.printf "n %d reps %d\n" n reps;
  Printf.printf "max error %.3e\n" !worst;
  Printf.printf "log|det| %.6f sign %d checksum %.6f\n" !logdet !sign !check
