(* Particles with mutable float fields and a pairwise-interaction driver. *)

type t = {
  mutable x : float; mutable y : float; mutable z : float;
  mutable vx : float; mutable vy : float; mutable vz : float;
  mutable ax : float; mutable ay : float; mutable az : float;
  m : float;
}

let create ~m x y z vx vy vz = { x; y; z; vx; vy; vz; ax = 0.; ay = 0.; az = 0.; m }

(* calls [f] once per unordered pair *)
let each_pair ps f =
  let n = Array.length ps in
  for i = 0 to n - 2 do
    let p = ps.(i) in
    for j = i + 1 to n - 1 do f p ps.(j) done
  done

let dist2 p q ~eps2 =
  let dx = q.x -. p.x and dy = q.y -. p.y and dz = q.z -. p.z in
  (dx *. dx) +. (dy *. dy) +. (dz *. dz) +. eps2

let kinetic ps = Array.fold_left (fun e p -> e +. (0.5 *. p.m *. ((p.vx *. p.vx) +. (p.vy *. p.vy) +. (p.vz *. p.vz)))) 0. ps
