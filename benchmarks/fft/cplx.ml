(* Complex numbers as float records; the FFT inner loop is nothing but calls to these. *)
type t = { re : float; im : float }

let zero = { re = 0.; im = 0. }
let one = { re = 1.; im = 0. }
let make re im = { re; im }
let of_float re = { re; im = 0. }
let add a b = { re = a.re +. b.re; im = a.im +. b.im }
let sub a b = { re = a.re -. b.re; im = a.im -. b.im }
let mul a b = { re = (a.re *. b.re) -. (a.im *. b.im); im = (a.re *. b.im) +. (a.im *. b.re) }
let scale k a = { re = k *. a.re; im = k *. a.im }
let conj a = { re = a.re; im = -.a.im }
let expi theta = { re = cos theta; im = sin theta }
let norm2 a = (a.re *. a.re) +. (a.im *. a.im)
