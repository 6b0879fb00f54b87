(* Small 3-vectors as float-only records (stored unboxed); every operation is a tiny
   function, so whether they are inlined decides whether the integrator allocates. *)
type t = { x : float; y : float; z : float }

let zero = { x = 0.; y = 0.; z = 0. }
let make x y z = { x; y; z }
let add a b = { x = a.x +. b.x; y = a.y +. b.y; z = a.z +. b.z }
let sub a b = { x = a.x -. b.x; y = a.y -. b.y; z = a.z -. b.z }
let scale k a = { x = k *. a.x; y = k *. a.y; z = k *. a.z }

(* k * a + b *)
let axpy k a b = { x = (k *. a.x) +. b.x; y = (k *. a.y) +. b.y; z = (k *. a.z) +. b.z }
let dot a b = (a.x *. b.x) +. (a.y *. b.y) +. (a.z *. b.z)
let norm2 a = dot a a
let norm a = sqrt (norm2 a)

let cross a b =
  { x = (a.y *. b.z) -. (a.z *. b.y);
    y = (a.z *. b.x) -. (a.x *. b.z);
    z = (a.x *. b.y) -. (a.y *. b.x) }

(* rotation about the x axis by angle [i] (orbital inclination) *)
let tilt i a =
  let c = cos i and s = sin i in
  { x = a.x; y = (c *. a.y) -. (s *. a.z); z = (s *. a.y) +. (c *. a.z) }

(* rotation about the z axis by angle [w] (argument of periapsis) *)
let spin w a =
  let c = cos w and s = sin w in
  { x = (c *. a.x) -. (s *. a.y); y = (s *. a.x) +. (c *. a.y); z = a.z }
