(* LU decomposition with partial pivoting (Doolittle, in place), triangular solves,
   determinant. *)

type t = { lu : Matrix.t; perm : int array; sign : float }

let decompose a =
  let n = a.Matrix.rows in
  let m = Matrix.copy a in
  let perm = Array.init n (fun i -> i) in
  let sign = ref 1. in
  for k = 0 to n - 1 do
    let piv = ref k in
    for i = k + 1 to n - 1 do
      if Float.abs (Matrix.get m i k) > Float.abs (Matrix.get m !piv k) then piv := i
    done;
    if !piv <> k then begin
      Matrix.swap_rows m k !piv;
      let t = perm.(k) in perm.(k) <- perm.(!piv); perm.(!piv) <- t;
      sign := -. !sign
    end;
    let d = Matrix.get m k k in
    for i = k + 1 to n - 1 do
      let l = Matrix.get m i k /. d in
      Matrix.set m i k l;
      for j = k + 1 to n - 1 do
        Matrix.update m i j (fun v -> v -. (l *. Matrix.get m k j))
      done
    done
  done;
  { lu = m; perm; sign = !sign }

let solve { lu; perm; _ } b =
  let n = lu.Matrix.rows in
  let y = Array.init n (fun i -> b.(perm.(i))) in
  for i = 0 to n - 1 do
    for j = 0 to i - 1 do y.(i) <- y.(i) -. (Matrix.get lu i j *. y.(j)) done
  done;
  for i = n - 1 downto 0 do
    for j = i + 1 to n - 1 do y.(i) <- y.(i) -. (Matrix.get lu i j *. y.(j)) done;
    y.(i) <- y.(i) /. Matrix.get lu i i
  done;
  y

let log_abs_det { lu; sign; _ } =
  let s = ref 0. and neg = ref (sign < 0.) in
  for i = 0 to lu.Matrix.rows - 1 do
    let d = Matrix.get lu i i in
    if d < 0. then neg := not !neg;
    s := !s +. log (Float.abs d)
  done;
  (!s, if !neg then -1 else 1)
