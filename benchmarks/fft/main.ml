(* Multiplies pseudo-random decimal numbers of 2^(k-1) digits by FFT convolution,
   [reps] times, and checks the low digits against schoolbook multiplication. *)

let lcg state =
  state := (!state * 1103515245 + 12345) land 0x3fffffff;
  !state lsr 8

let () =
  let k = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 12 in
  let reps = if Array.length Sys.argv > 2 then int_of_string Sys.argv.(2) else 1 in
  let n = 1 lsl k in
  let plan = Fft.plan n in
  let seed = ref 42 in
  let digit_sum = ref 0 and checked = ref 0 and last = ref "" in
  for _ = 1 to reps do
    let a = Array.init (n / 2) (fun _ -> lcg seed mod 10) in
    let b = Array.init (n / 2) (fun _ -> lcg seed mod 10) in
    let c = Bignum.mul plan a b in
    let k = min 64 (n / 2) in
    if Array.sub c 0 k = Bignum.low_digits_check a b k then incr checked;
    digit_sum := !digit_sum + Array.fold_left ( + ) 0 c;
    last := Bignum.to_string_top c 30
  done;
  Printf.printf "fft size %d, %d products, %d low-digit checks ok\n" n reps !checked;
  Printf.printf "digit sum %d\n" !digit_sum;
  Printf.printf "last product starts %s\n" !last
