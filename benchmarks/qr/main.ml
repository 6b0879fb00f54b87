(* Householder QR of pseudo-random m x n matrices (m > n) and least-squares solves: the
   right-hand side is A x0 plus a component orthogonal-ish noise, and the program reports
   how close the solution is to x0 and the residual. *)

let () =
  let n = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 50 in
  let reps = if Array.length Sys.argv > 2 then int_of_string Sys.argv.(2) else 1 in
  let m = (3 * n) / 2 in
  let st = ref 987654321 in
  let rnd () =
    st := ((!st * 48271) mod 0x7fffffff);
    (float_of_int !st /. float_of_int 0x7fffffff) -. 0.5
  in
  let worst = ref 0. and resid = ref 0. and logdet = ref 0. and check = ref 0. in
  for r = 1 to reps do
    let a = Mat.init m n (fun _ _ -> rnd ()) in
    let x0 = Array.init n (fun j -> float_of_int ((j mod 7) - 3) +. (0.25 *. float_of_int r)) in
    let b = Mat.mul_vec a x0 in
    let qr = Householder.factor a in
    let x = Householder.solve qr b in
    Array.iteri (fun j xj -> worst := Float.max !worst (Float.abs (xj -. x0.(j)))) x;
    (* noisy right-hand side: residual norm of the fit *)
    let bn = Array.mapi (fun i bi -> bi +. (0.01 *. rnd ()) +. if i mod 2 = 0 then 0.001 else 0.) b in
    let xn = Householder.solve qr bn in
    let fit = Mat.mul_vec a xn in
    resid := !resid +. sqrt (Array.fold_left ( +. ) 0. (Array.mapi (fun i f -> (f -. bn.(i)) ** 2.) fit));
    logdet := Array.fold_left (fun s d -> s +. log (Float.abs d)) 0. qr.Householder.rdiag;
    check := !check +. Array.fold_left ( +. ) 0. xn
  done;
  Printf.printf "m %d n %d reps %d\n" m n reps;
  Printf.printf "exact rhs: max error below 1e-9: %b\n" (!worst < 1e-9);
  Printf.printf "noisy rhs: mean residual %.6f checksum %.5f\n" (!resid /. float_of_int reps) !check;
  Printf.printf "log|det R| (last) %.5f\n" !logdet
