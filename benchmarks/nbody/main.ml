(* A softened self-gravitating cluster of particles placed by a fixed-seed generator,
   integrated with velocity Verlet; prints the energy budget. *)
open Particle

let eps2 = 0.01

let forces ps =
  Array.iter (fun p -> p.ax <- 0.; p.ay <- 0.; p.az <- 0.) ps;
  each_pair ps (fun p q ->
    let r2 = dist2 p q ~eps2 in
    let inv = 1. /. (r2 *. sqrt r2) in
    let dx = q.x -. p.x and dy = q.y -. p.y and dz = q.z -. p.z in
    let fp = q.m *. inv and fq = p.m *. inv in
    p.ax <- p.ax +. (fp *. dx); p.ay <- p.ay +. (fp *. dy); p.az <- p.az +. (fp *. dz);
    q.ax <- q.ax -. (fq *. dx); q.ay <- q.ay -. (fq *. dy); q.az <- q.az -. (fq *. dz))

let potential ps =
  let e = ref 0. in
  each_pair ps (fun p q -> e := !e -. (p.m *. q.m /. sqrt (dist2 p q ~eps2)));
  !e

let step dt ps =
  Array.iter (fun p ->
    p.vx <- p.vx +. (0.5 *. dt *. p.ax); p.vy <- p.vy +. (0.5 *. dt *. p.ay); p.vz <- p.vz +. (0.5 *. dt *. p.az);
    p.x <- p.x +. (dt *. p.vx); p.y <- p.y +. (dt *. p.vy); p.z <- p.z +. (dt *. p.vz)) ps;
  forces ps;
  Array.iter (fun p ->
    p.vx <- p.vx +. (0.5 *. dt *. p.ax); p.vy <- p.vy +. (0.5 *. dt *. p.ay); p.vz <- p.vz +. (0.5 *. dt *. p.az)) ps

let () =
  let n = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 64 in
  let steps = if Array.length Sys.argv > 2 then int_of_string Sys.argv.(2) else 100 in
  Random.init 20240607;
  let coord () = Random.float 2. -. 1. in
  let ps =
    Array.init n (fun _ ->
      let rec inside () = let x = coord () and y = coord () and z = coord () in
        if (x *. x) +. (y *. y) +. (z *. z) <= 1. then (x, y, z) else inside () in
      let x, y, z = inside () in
      create ~m:(1. /. float n) x y z (-0.3 *. y) (0.3 *. x) 0.)
  in
  forces ps;
  let e0 = kinetic ps +. potential ps in
  for _ = 1 to steps do step 0.001 ps done;
  let e1 = kinetic ps +. potential ps in
  Printf.printf "%d particles, %d steps\n" n steps;
  Printf.printf "energy %.9f -> %.9f\n" e0 e1;
  Printf.printf "kinetic %.9f\n" (kinetic ps)
