(* Levinson-Durbin recursion for the normal equations of linear prediction, and
   Levinson's solver for symmetric Toeplitz systems with an arbitrary right-hand side. *)

type lpc = { coeffs : float array; reflection : float array; error : float }

(* r.(0..p): autocorrelation; returns a with x(t) ~ sum a_k x(t-k). *)
let durbin r p =
  let a = Array.make p 0. and refl = Array.make p 0. in
  let rec step m err =
    if m = p then err
    else begin
      let acc = ref r.(m + 1) in
      for j = 0 to m - 1 do acc := !acc -. (a.(j) *. r.(m - j)) done;
      let k = !acc /. err in
      refl.(m) <- k;
      let prev = Array.sub a 0 m in
      for j = 0 to m - 1 do a.(j) <- prev.(j) -. (k *. prev.(m - 1 - j)) done;
      a.(m) <- k;
      step (m + 1) (err *. (1. -. (k *. k)))
    end
  in
  let error = step 0 r.(0) in
  { coeffs = a; reflection = refl; error }

(* Solves T x = b, T symmetric Toeplitz with first row t, by forward and backward vectors
   (here one suffices: the backward vector is the reverse of the forward one). *)
let solve t b =
  let n = Array.length b in
  let f = Array.make n 0. and x = Array.make n 0. in
  f.(0) <- 1. /. t.(0);
  x.(0) <- b.(0) /. t.(0);
  for m = 1 to n - 1 do
    let ef = ref 0. and ex = ref 0. in
    for j = 0 to m - 1 do
      ef := !ef +. (t.(m - j) *. f.(j));
      ex := !ex +. (t.(m - j) *. x.(j))
    done;
    let denom = 1. -. (!ef *. !ef) in
    let fnew = Array.init (m + 1) (fun j ->
        let fj = if j < m then f.(j) else 0. and bj = if j > 0 then f.(m - j) else 0. in
        (fj -. (!ef *. bj)) /. denom) in
    Array.blit fnew 0 f 0 (m + 1);
    let c = b.(m) -. !ex in
    for j = 0 to m do x.(j) <- x.(j) +. (c *. f.(m - j)) done
  done;
  x

let mul t x =
  let n = Array.length x in
  Array.init n (fun i ->
      let s = ref 0. in
      for j = 0 to n - 1 do s := !s +. (t.(abs (i - j)) *. x.(j)) done;
      !s)
