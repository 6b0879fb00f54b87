(* Points and rigid 3-D transformations (rotation matrix and translation) as records of
   floats. *)

type pt = { x : float; y : float; z : float }

type t = {
  a : float; b : float; c : float;   (* rotation rows *)
  d : float; e : float; f : float;
  g : float; h : float; i : float;
  tx : float; ty : float; tz : float;
}

let pt x y z = { x; y; z }
let sub p q = { x = p.x -. q.x; y = p.y -. q.y; z = p.z -. q.z }
let dist2 p q = let v = sub p q in (v.x *. v.x) +. (v.y *. v.y) +. (v.z *. v.z)

let identity = { a = 1.; b = 0.; c = 0.; d = 0.; e = 1.; f = 0.; g = 0.; h = 0.; i = 1.; tx = 0.; ty = 0.; tz = 0. }

let apply m p =
  { x = (m.a *. p.x) +. (m.b *. p.y) +. (m.c *. p.z) +. m.tx;
    y = (m.d *. p.x) +. (m.e *. p.y) +. (m.f *. p.z) +. m.ty;
    z = (m.g *. p.x) +. (m.h *. p.y) +. (m.i *. p.z) +. m.tz }

(* [compose m n] applies n first, then m. *)
let compose m n =
  let t = apply m { x = n.tx; y = n.ty; z = n.tz } in
  { a = (m.a *. n.a) +. (m.b *. n.d) +. (m.c *. n.g);
    b = (m.a *. n.b) +. (m.b *. n.e) +. (m.c *. n.h);
    c = (m.a *. n.c) +. (m.b *. n.f) +. (m.c *. n.i);
    d = (m.d *. n.a) +. (m.e *. n.d) +. (m.f *. n.g);
    e = (m.d *. n.b) +. (m.e *. n.e) +. (m.f *. n.h);
    f = (m.d *. n.c) +. (m.e *. n.f) +. (m.f *. n.i);
    g = (m.g *. n.a) +. (m.h *. n.d) +. (m.i *. n.g);
    h = (m.g *. n.b) +. (m.h *. n.e) +. (m.i *. n.h);
    i = (m.g *. n.c) +. (m.h *. n.f) +. (m.i *. n.i);
    tx = t.x; ty = t.y; tz = t.z }

(* Rotation from a (not necessarily unit) quaternion with a translation; only sqrt is
   used, so results do not depend on the C library. *)
let of_quaternion (w, x, y, z) (tx, ty, tz) =
  let n = sqrt ((w *. w) +. (x *. x) +. (y *. y) +. (z *. z)) in
  let w = w /. n and x = x /. n and y = y /. n and z = z /. n in
  { a = 1. -. (2. *. ((y *. y) +. (z *. z))); b = 2. *. ((x *. y) -. (z *. w)); c = 2. *. ((x *. z) +. (y *. w));
    d = 2. *. ((x *. y) +. (z *. w)); e = 1. -. (2. *. ((x *. x) +. (z *. z))); f = 2. *. ((y *. z) -. (x *. w));
    g = 2. *. ((x *. z) -. (y *. w)); h = 2. *. ((y *. z) +. (x *. w)); i = 1. -. (2. *. ((x *. x) +. (y *. y)));
    tx; ty; tz }
