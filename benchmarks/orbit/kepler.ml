(* Two-body orbits from orbital elements: solves Kepler's equation with a generic
   Newton iteration that takes the function and its derivative as closures. *)

let newton ?(tol = 1e-15) ?(max_iter = 60) f df x0 =
  let rec go x i =
    if i >= max_iter then x
    else
      let dx = f x /. df x in
      let x' = x -. dx in
      if Float.abs dx <= tol *. (1. +. Float.abs x') then x' else go x' (i + 1)
  in
  go x0 0

let wrap_angle m =
  let two_pi = 2. *. Float.pi in
  let r = Float.rem m two_pi in
  if r < 0. then r +. two_pi else r

let eccentric_anomaly e m =
  let m = wrap_angle m in
  let x0 = if e < 0.8 then m else Float.pi in
  newton (fun ea -> ea -. (e *. sin ea) -. m) (fun ea -> 1. -. (e *. cos ea)) x0

type elements = {
  a : float;  (* semi-major axis *)
  e : float;  (* eccentricity *)
  incl : float;  (* inclination *)
  peri : float;  (* argument of periapsis *)
  m0 : float;  (* mean anomaly at t = 0 *)
}

(* position and velocity relative to the central body at time [t] *)
let state ~mu el t =
  let n = sqrt (mu /. (el.a *. el.a *. el.a)) in
  let ea = eccentric_anomaly el.e (el.m0 +. (n *. t)) in
  let ce = cos ea and se = sin ea in
  let b = el.a *. sqrt (1. -. (el.e *. el.e)) in
  let edot = n /. (1. -. (el.e *. ce)) in
  let place v = Vec3.tilt el.incl (Vec3.spin el.peri v) in
  let pos = place (Vec3.make (el.a *. (ce -. el.e)) (b *. se) 0.) in
  let vel = place (Vec3.make (-.el.a *. se *. edot) (b *. ce *. edot) 0.) in
  (pos, vel)
