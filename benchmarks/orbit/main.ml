(* A sun with five planets set up from Keplerian elements, integrated with leapfrog;
   reports energy and angular momentum drift and the final planet positions.
   Units: AU, years, solar masses (so G = 4 pi^2). *)

module Newton = Leapfrog.Make (struct
  let g = 4. *. Float.pi *. Float.pi
  let factor r2 = 1. /. (r2 *. sqrt r2)
  let potential r2 = 1. /. sqrt r2
end)

let planets =
  [| (* mass, elements *)
     (1.66e-7, { Kepler.a = 0.387; e = 0.2056; incl = 0.122; peri = 0.508; m0 = 3.05 });
     (2.45e-6, { Kepler.a = 0.723; e = 0.0068; incl = 0.059; peri = 0.958; m0 = 0.87 });
     (3.00e-6, { Kepler.a = 1.000; e = 0.0167; incl = 0.000; peri = 1.796; m0 = 6.24 });
     (3.23e-7, { Kepler.a = 1.524; e = 0.0934; incl = 0.032; peri = 5.000; m0 = 0.34 });
     (9.55e-4, { Kepler.a = 5.203; e = 0.0484; incl = 0.023; peri = 4.780; m0 = 0.60 }) |]

let () =
  let steps = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 10000 in
  let dt = 0.0005 in
  let mu = 4. *. Float.pi *. Float.pi in
  let sun = { Leapfrog.pos = Vec3.zero; vel = Vec3.zero; mass = 1.0 } in
  let bodies =
    Array.append [| sun |]
      (Array.map
         (fun (m, el) ->
           let pos, vel = Kepler.state ~mu el 0. in
           { Leapfrog.pos; vel; mass = m })
         planets)
  in
  (* move to the barycentric frame *)
  let total = Array.fold_left (fun s b -> s +. b.Leapfrog.mass) 0. bodies in
  let p = Array.fold_left (fun s b -> Vec3.axpy b.Leapfrog.mass b.Leapfrog.vel s) Vec3.zero bodies in
  let c = Array.fold_left (fun s b -> Vec3.axpy b.Leapfrog.mass b.Leapfrog.pos s) Vec3.zero bodies in
  Array.iter
    (fun b ->
      b.Leapfrog.vel <- Vec3.axpy (-1. /. total) p b.Leapfrog.vel;
      b.Leapfrog.pos <- Vec3.axpy (-1. /. total) c b.Leapfrog.pos)
    bodies;
  let e0 = Newton.energy bodies in
  let l0 = Newton.angular_momentum bodies in
  Newton.run ~dt ~steps bodies;
  let e1 = Newton.energy bodies in
  let l1 = Newton.angular_momentum bodies in
  Printf.printf "steps %d, t = %.4f yr\n" steps (dt *. float steps);
  Printf.printf "energy %.12e -> %.12e\n" e0 e1;
  Printf.printf "angular momentum change %.3e\n" (Vec3.norm (Vec3.sub l1 l0));
  Array.iteri
    (fun i b ->
      if i > 0 then begin
        let r = Vec3.sub b.Leapfrog.pos bodies.(0).Leapfrog.pos in
        let el = snd planets.(i - 1) in
        let kep, _ = Kepler.state ~mu el (dt *. float steps) in
        Printf.printf "planet %d r=%.6f (two-body %.6f)\n" i (Vec3.norm r) (Vec3.norm kep)
      end)
    bodies
