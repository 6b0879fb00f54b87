(* Complex arithmetic on unboxed-friendly pairs, and the escape-time iteration. *)

type t = { re : float; im : float }

let make re im = { re; im }
let add a b = { re = a.re +. b.re; im = a.im +. b.im }
let sqr a = { re = (a.re *. a.re) -. (a.im *. a.im); im = 2. *. a.re *. a.im }
let norm2 a = (a.re *. a.re) +. (a.im *. a.im)

(* number of iterations of z <- z^2 + c before |z| > 2, capped at [limit] *)
let escape ~limit c =
  let rec go z i = if i >= limit then limit else if norm2 z > 4. then i else go (add (sqr z) c) (i + 1) in
  go c 0

let in_set ~limit c = escape ~limit c >= limit
