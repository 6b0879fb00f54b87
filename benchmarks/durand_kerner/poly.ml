(* Monic complex polynomials as coefficient arrays, lowest degree first, and the two
   simultaneous root iterations. *)

let of_roots roots =
  Array.fold_left
    (fun p r ->
      (* p * (x - r) *)
      let n = Array.length p in
      Array.init (n + 1) (fun k ->
          let hi = if k > 0 then p.(k - 1) else Cx.zero in
          let lo = if k < n then Cx.mul r p.(k) else Cx.zero in
          Cx.sub hi lo))
    [| Cx.one |] roots

let eval p z = Array.fold_right (fun c acc -> Cx.add c (Cx.mul acc z)) p Cx.zero

(* value and derivative by Horner *)
let eval2 p z =
  let v = ref Cx.zero and d = ref Cx.zero in
  for k = Array.length p - 1 downto 0 do
    d := Cx.add (Cx.mul !d z) !v;
    v := Cx.add (Cx.mul !v z) p.(k)
  done;
  (!v, !d)

let cauchy_bound p =
  let n = Array.length p - 1 in
  1. +. Array.fold_left (fun m c -> Float.max m (Cx.abs c)) 0. (Array.sub p 0 n)

(* Starting points on a circle, rotated by a fixed complex number of modulus one. *)
let initial p =
  let n = Array.length p - 1 in
  let rot = Cx.make 0.6 0.8 in
  let start = Cx.make (0.5 *. cauchy_bound p) (0.1 *. cauchy_bound p) in
  let z = Array.make n start in
  for k = 1 to n - 1 do z.(k) <- Cx.mul z.(k - 1) rot done;
  z

let fold_others z i f init =
  let acc = ref init in
  Array.iteri (fun j zj -> if j <> i then acc := f !acc (Cx.sub z.(i) zj)) z;
  !acc

(* One Weierstrass (Durand-Kerner) correction for root i. *)
let durand_kerner p z i =
  let denom = fold_others z i Cx.mul Cx.one in
  Cx.div (eval p z.(i)) denom

(* One Aberth-Ehrlich correction for root i. *)
let aberth p z i =
  let v, d = eval2 p z.(i) in
  let w = Cx.div v d in
  let s = fold_others z i (fun s dz -> Cx.add s (Cx.inv dz)) Cx.zero in
  Cx.div w (Cx.sub Cx.one (Cx.mul w s))

(* Gauss-Seidel style sweeps with [correction] until the largest step is below tol. *)
let solve ?(tol = 1e-10) ?(max_iter = 500) correction p =
  let z = initial p in
  let rec sweep it =
    let biggest = ref 0. in
    for i = 0 to Array.length z - 1 do
      let dz = correction p z i in
      z.(i) <- Cx.sub z.(i) dz;
      biggest := Float.max !biggest (Cx.norm2 dz)
    done;
    if !biggest < tol *. tol || it >= max_iter then it else sweep (it + 1)
  in
  let iterations = sweep 1 in
  (z, iterations)
