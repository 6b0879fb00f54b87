(* xorshift64* style generator restricted to OCaml's 63-bit ints. *)

type t = { mutable x : int }

let create seed = { x = (if seed = 0 then 88172645463325252 else seed) }

let bits g =
  let x = g.x in
  let x = x lxor (x lsl 13) in
  let x = x lxor (x lsr 7) in
  let x = x lxor (x lsl 17) in
  g.x <- x;
  (x lsr 11) land 0xfffffffffff

(* uniform in [lo, hi) *)
let uniform g lo hi = lo +. ((hi -. lo) *. float_of_int (bits g) /. 17592186044416.)
