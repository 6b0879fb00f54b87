(* Root finding and small dense linear algebra for the calibrations. *)

(* Newton's method kept inside a bracket, falling back to bisection *)
let newton_bracketed ~f ~df ~lo ~hi ~x0 ~tol =
  let rec go lo hi x k =
    let fx = f x in
    if Float.abs fx < tol || k > 100 then x
    else
      let lo, hi = if fx > 0. then (lo, x) else (x, hi) in
      let d = df x in
      let x' = if d > 0. then x -. (fx /. d) else nan in
      let x' = if x' > lo && x' < hi then x' else 0.5 *. (lo +. hi) in
      if hi -. lo < tol *. 1e-3 then x' else go lo hi x' (k + 1)
  in
  go lo hi x0 0

(* solve a small linear system by Gaussian elimination with partial pivoting *)
let solve a b =
  let n = Array.length b in
  let a = Array.map Array.copy a and b = Array.copy b in
  for col = 0 to n - 1 do
    let piv = ref col in
    for r = col + 1 to n - 1 do
      if Float.abs a.(r).(col) > Float.abs a.(!piv).(col) then piv := r
    done;
    let t = a.(col) in a.(col) <- a.(!piv); a.(!piv) <- t;
    let t = b.(col) in b.(col) <- b.(!piv); b.(!piv) <- t;
    for r = col + 1 to n - 1 do
      let m = a.(r).(col) /. a.(col).(col) in
      for c = col to n - 1 do a.(r).(c) <- a.(r).(c) -. (m *. a.(col).(c)) done;
      b.(r) <- b.(r) -. (m *. b.(col))
    done
  done;
  let x = Array.make n 0. in
  for r = n - 1 downto 0 do
    let s = ref b.(r) in
    for c = r + 1 to n - 1 do s := !s -. (a.(r).(c) *. x.(c)) done;
    x.(r) <- !s /. a.(r).(r)
  done;
  x

(* Levenberg-Marquardt for least squares: [residuals p] returns the residual vector;
   the Jacobian is taken by forward differences. *)
let levenberg_marquardt ~residuals ~p0 ~iters =
  let np = Array.length p0 in
  let sumsq r = Array.fold_left (fun s x -> s +. (x *. x)) 0. r in
  let rec go p lambda k =
    let r = residuals p in
    if k = 0 then (p, sumsq r)
    else begin
      let m = Array.length r in
      let jac =
        Array.init np (fun j ->
          let h = 1e-7 *. Float.max 1. (Float.abs p.(j)) in
          let p' = Array.mapi (fun i v -> if i = j then v +. h else v) p in
          let r' = residuals p' in
          Array.init m (fun i -> (r'.(i) -. r.(i)) /. h))
      in
      let dot u v = let s = ref 0. in Array.iteri (fun i x -> s := !s +. (x *. v.(i))) u; !s in
      let jtj = Array.init np (fun a -> Array.init np (fun b -> dot jac.(a) jac.(b))) in
      let jtr = Array.init np (fun a -> -.dot jac.(a) r) in
      (* Marquardt scaling, plus a little plain damping for parameters with no gradient *)
      for a = 0 to np - 1 do jtj.(a).(a) <- (jtj.(a).(a) *. (1. +. lambda)) +. (lambda *. 1e-6) done;
      let step = solve jtj jtr in
      let p' = Array.mapi (fun i v -> v +. step.(i)) p in
      if sumsq (residuals p') < sumsq r then go p' (lambda *. 0.3) (k - 1) else go p (lambda *. 4.) (k - 1)
    end
  in
  go p0 1e-3 iters
