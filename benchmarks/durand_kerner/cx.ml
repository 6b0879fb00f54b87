(* A small complex-number module over records of floats. *)

type t = { re : float; im : float }

let make re im = { re; im }
let zero = { re = 0.; im = 0. }
let one = { re = 1.; im = 0. }
let add a b = { re = a.re +. b.re; im = a.im +. b.im }
let sub a b = { re = a.re -. b.re; im = a.im -. b.im }
let mul a b = { re = (a.re *. b.re) -. (a.im *. b.im); im = (a.re *. b.im) +. (a.im *. b.re) }
let scale k a = { re = k *. a.re; im = k *. a.im }
let norm2 a = (a.re *. a.re) +. (a.im *. a.im)
let abs a = sqrt (norm2 a)
let inv a = let d = norm2 a in { re = a.re /. d; im = -.a.im /. d }
let div a b = mul a (inv b)
