(* Householder QR: A = Q R with Q stored as reflectors v_k (in the lower part of the
   factored matrix, v_k(k) kept apart) and R in the upper triangle. *)

type qr = { f : Mat.t; vkk : float array; tau : float array; rdiag : float array }

let column_norm a k = sqrt (Mat.sum_rows k a.Mat.m (fun i -> let x = Mat.get a i k in x *. x))

(* Apply I - tau v v^T (v stored in column k from row k) to column j of a. *)
let reflect a k vkk tau j =
  let dotv = (vkk *. Mat.get a k j) +. Mat.sum_rows (k + 1) a.Mat.m (fun i -> Mat.get a i k *. Mat.get a i j) in
  let s = tau *. dotv in
  Mat.set a k j (Mat.get a k j -. (s *. vkk));
  for i = k + 1 to a.Mat.m - 1 do Mat.set a i j (Mat.get a i j -. (s *. Mat.get a i k)) done

let factor a0 =
  let a = Mat.copy a0 in
  let n = a.Mat.n in
  let vkk = Array.make n 0. and tau = Array.make n 0. and rdiag = Array.make n 0. in
  for k = 0 to n - 1 do
    let nrm = column_norm a k in
    let akk = Mat.get a k k in
    let alpha = if akk > 0. then -.nrm else nrm in
    let v0 = akk -. alpha in
    let vnorm2 = (v0 *. v0) +. ((nrm *. nrm) -. (akk *. akk)) in
    let t = if vnorm2 = 0. then 0. else 2. /. vnorm2 in
    vkk.(k) <- v0;
    tau.(k) <- t;
    rdiag.(k) <- alpha;
    for j = k + 1 to n - 1 do reflect a k v0 t j done
  done;
  { f = a; vkk; tau; rdiag }

(* b := Q^T b *)
let apply_qt { f; vkk; tau; _ } b =
  for k = 0 to f.Mat.n - 1 do
    let d = (vkk.(k) *. b.(k)) +. Mat.sum_rows (k + 1) f.Mat.m (fun i -> Mat.get f i k *. b.(i)) in
    let s = tau.(k) *. d in
    b.(k) <- b.(k) -. (s *. vkk.(k));
    for i = k + 1 to f.Mat.m - 1 do b.(i) <- b.(i) -. (s *. Mat.get f i k) done
  done

(* Least-squares solution of min |A x - b|. *)
let solve qr b =
  let c = Array.copy b in
  apply_qt qr c;
  let n = qr.f.Mat.n in
  let x = Array.make n 0. in
  for i = n - 1 downto 0 do
    let s = ref c.(i) in
    for j = i + 1 to n - 1 do s := !s -. (Mat.get qr.f i j *. x.(j)) done;
    x.(i) <- !s /. qr.rdiag.(i)
  done;
  x
