(* Synthetic signals: an autoregressive process driven by pseudo-random noise, frames
   with a window, and their autocorrelation. *)

type rng = { mutable s : int }

let rng seed = { s = seed }

(* roughly normal: sum of four uniforms, centred *)
let noise g =
  let u () = g.s <- ((g.s * 1103515245) + 12345) land 0x7fffffff; float_of_int (g.s lsr 8) /. 8388608. in
  u () +. u () +. u () +. u () -. 2.

(* x(t) = sum a_k x(t-k) + e(t) *)
let ar_process g coeffs n =
  let p = Array.length coeffs in
  let x = Array.make (n + p) 0. in
  for t = p to n + p - 1 do
    let s = ref (noise g) in
    Array.iteri (fun k a -> s := !s +. (a *. x.(t - k - 1))) coeffs;
    x.(t) <- !s
  done;
  Array.sub x p n

(* A triangular window applied through a weight closure. *)
let windowed (x : float array) start len (w : int -> int -> float) = Array.init len (fun i -> x.(start + i) *. w i len)
let triangle i len = 1. -. Float.abs ((2. *. float_of_int i /. float_of_int (len - 1)) -. 1.) *. 0.5

let autocorrelation x lags =
  let n = Array.length x in
  Array.init (lags + 1) (fun lag ->
      let rec go i acc = if i >= n then acc else go (i + 1) (acc +. (x.(i) *. x.(i - lag))) in
      go lag 0.)
