(* In-place iterative radix-2 FFT. The butterfly is passed to a generic pass driver,
   and the twiddle factors come from a table built with a closure. *)

let log2 n =
  let rec go k m = if m >= n then k else go (k + 1) (2 * m) in
  go 0 1

let bit_reverse_permute a =
  let n = Array.length a in
  let bits = log2 n in
  let rev i =
    let r = ref 0 in
    for b = 0 to bits - 1 do
      if i land (1 lsl b) <> 0 then r := !r lor (1 lsl (bits - 1 - b))
    done;
    !r
  in
  for i = 0 to n - 1 do
    let j = rev i in
    if j > i then begin
      let t = a.(i) in
      a.(i) <- a.(j);
      a.(j) <- t
    end
  done

type plan = { n : int; twiddle : Cplx.t array }

let plan n =
  if n land (n - 1) <> 0 then invalid_arg "Fft.plan: size must be a power of two";
  { n; twiddle = Array.init (max 1 (n / 2)) (fun k -> Cplx.expi (-2. *. Float.pi *. float k /. float n)) }

(* one pass over blocks of length [len]: [butterfly u v w] returns the new pair *)
let pass plan a len butterfly =
  let half = len / 2 in
  let stride = plan.n / len in
  let i = ref 0 in
  while !i < plan.n do
    for j = 0 to half - 1 do
      let w = plan.twiddle.(j * stride) in
      let p = !i + j and q = !i + j + half in
      butterfly a p q w
    done;
    i := !i + len
  done

let forward_butterfly a p q w =
  let u = a.(p) and v = Cplx.mul a.(q) w in
  a.(p) <- Cplx.add u v;
  a.(q) <- Cplx.sub u v

let inverse_butterfly a p q w = forward_butterfly a p q (Cplx.conj w)

let transform plan ~inverse a =
  if Array.length a <> plan.n then invalid_arg "Fft.transform: wrong size";
  bit_reverse_permute a;
  let butterfly = if inverse then inverse_butterfly else forward_butterfly in
  let len = ref 2 in
  while !len <= plan.n do
    pass plan a !len butterfly;
    len := !len * 2
  done;
  if inverse then begin
    let k = 1. /. float plan.n in
    Array.iteri (fun i z -> a.(i) <- Cplx.scale k z) a
  end

(* cyclic convolution of two real sequences *)
let convolve plan x y =
  let fx = Array.map Cplx.of_float x and fy = Array.map Cplx.of_float y in
  transform plan ~inverse:false fx;
  transform plan ~inverse:false fy;
  let prod = Array.map2 Cplx.mul fx fy in
  transform plan ~inverse:true prod;
  Array.map (fun z -> z.Cplx.re) prod
