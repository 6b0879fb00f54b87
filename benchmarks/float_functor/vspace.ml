(* Vectors over a field and the conjugate gradient method, written once for any field. *)

module Make (F : Field.S) = struct
  type vec = F.t array

  let dot u v =
    let s = ref F.zero in
    for i = 0 to Array.length u - 1 do s := F.add !s (F.mul u.(i) v.(i)) done;
    !s

  (* y <- a x + y *)
  let axpy a x y = Array.iteri (fun i xi -> y.(i) <- F.add (F.mul a xi) y.(i)) x
  let scale a x = Array.map (F.mul a) x
  let sub u v = Array.map2 F.sub u v

  (* solves A x = b for a symmetric positive definite operator given as a closure *)
  let conjugate_gradient ~apply ~b ~iters ~tol =
    let n = Array.length b in
    let x = Array.make n F.zero in
    let r = Array.copy b in
    let p = Array.copy b in
    let rr = ref (dot r r) in
    let k = ref 0 in
    while !k < iters && F.magnitude !rr > tol do
      let ap = apply p in
      let alpha = F.div !rr (dot p ap) in
      axpy alpha p x;
      axpy (F.neg alpha) ap r;
      let rr' = dot r r in
      let beta = F.div rr' !rr in
      Array.iteri (fun i ri -> p.(i) <- F.add ri (F.mul beta p.(i))) r;
      rr := rr';
      incr k
    done;
    (x, !k)
end
