(* Kick-drift-kick leapfrog for a small gravitating system, as a functor over the force
   law so the constants and the pair interaction are only known after instantiation. *)

type body = { mutable pos : Vec3.t; mutable vel : Vec3.t; mass : float }

module type LAW = sig
  val g : float
  (* acceleration factor for separation squared [r2]: a = g m d * factor r2 *)
  val factor : float -> float
  val potential : float -> float
end

module Make (L : LAW) = struct
  let iter_pairs f bodies =
    let n = Array.length bodies in
    for i = 0 to n - 1 do
      for j = i + 1 to n - 1 do
        f i j bodies.(i) bodies.(j)
      done
    done

  let accelerations bodies acc =
    Array.fill acc 0 (Array.length acc) Vec3.zero;
    iter_pairs
      (fun i j bi bj ->
        let d = Vec3.sub bj.pos bi.pos in
        let k = L.g *. L.factor (Vec3.norm2 d) in
        acc.(i) <- Vec3.axpy (k *. bj.mass) d acc.(i);
        acc.(j) <- Vec3.axpy (-.k *. bi.mass) d acc.(j))
      bodies

  let kick dt bodies acc =
    Array.iteri (fun i b -> b.vel <- Vec3.axpy dt acc.(i) b.vel) bodies

  let drift dt bodies = Array.iter (fun b -> b.pos <- Vec3.axpy dt b.vel b.pos) bodies

  let run ~dt ~steps bodies =
    let acc = Array.make (Array.length bodies) Vec3.zero in
    accelerations bodies acc;
    for _ = 1 to steps do
      kick (0.5 *. dt) bodies acc;
      drift dt bodies;
      accelerations bodies acc;
      kick (0.5 *. dt) bodies acc
    done

  let energy bodies =
    let kin =
      Array.fold_left (fun s b -> s +. (0.5 *. b.mass *. Vec3.norm2 b.vel)) 0. bodies
    in
    let pot = ref 0. in
    iter_pairs
      (fun _ _ bi bj ->
        pot := !pot -. (L.g *. bi.mass *. bj.mass *. L.potential (Vec3.norm2 (Vec3.sub bi.pos bj.pos))))
      bodies;
    kin +. !pot

  let angular_momentum bodies =
    Array.fold_left (fun l b -> Vec3.add l (Vec3.scale b.mass (Vec3.cross b.pos b.vel))) Vec3.zero bodies
end
