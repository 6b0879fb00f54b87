(* Decimal big numbers (little-endian digit arrays) multiplied through FFT convolution. *)

let normalize digits =
  let out = Array.make (Array.length digits + 1) 0 in
  let carry = ref 0 in
  Array.iteri
    (fun i d ->
      let v = d + !carry in
      out.(i) <- v mod 10;
      carry := v / 10)
    digits;
  out.(Array.length digits) <- !carry;
  if !carry >= 10 then failwith "Bignum.normalize: carry overflow";
  out

let mul plan a b =
  let n = plan.Fft.n in
  let pad x = Array.init n (fun i -> if i < Array.length x then float x.(i) else 0.) in
  let c = Fft.convolve plan (pad a) (pad b) in
  normalize (Array.map (fun v -> int_of_float (Float.round v)) c)

(* schoolbook product of the lowest [k] digits, to check the FFT result *)
let low_digits_check a b k =
  let acc = Array.make k 0 in
  for i = 0 to k - 1 do
    for j = 0 to k - 1 - i do
      if i < Array.length a && j < Array.length b then acc.(i + j) <- acc.(i + j) + (a.(i) * b.(j))
    done
  done;
  (* carry propagation within the low k digits only: the carry out of them is dropped *)
  let carry = ref 0 in
  Array.map
    (fun d ->
      let v = d + !carry in
      carry := v / 10;
      v mod 10)
    acc

let to_string_top digits count =
  let n = Array.length digits in
  let top = ref (n - 1) in
  while !top > 0 && digits.(!top) = 0 do decr top done;
  let b = Buffer.create count in
  let i = ref !top in
  while !i >= 0 && Buffer.length b < count do
    Buffer.add_char b (Char.chr (48 + digits.(!i)));
    decr i
  done;
  Buffer.contents b
