(* Prime statistics below N: count, sum, twin primes, residues mod 4, and a check of
   Goldbach's conjecture for the even numbers up to N/16. *)

let () =
  let limit = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 100000 in
  let reps = if Array.length Sys.argv > 2 then int_of_string Sys.argv.(2) else 1 in
  let res = ref (0, 0, 0, 0, 0) in
  for _ = 1 to reps do
    let s = Primes.sieve limit in
    let count = Primes.count_if (fun _ -> true) s in
    let sum = Primes.fold (fun p acc -> (acc + p) mod 1_000_000_007) s 0 in
    let twins = Primes.count_if (fun p -> Primes.is_prime s (p + 2)) s in
    let one_mod_4 = Primes.count_if (fun p -> p land 3 = 1) s in
    let goldbach_fail = ref 0 in
    let n = ref 4 in
    while !n <= limit / 16 do
      let p = ref 2 in
      while !p <= !n / 2 && not (Primes.is_prime s !p && Primes.is_prime s (!n - !p)) do incr p done;
      if !p > !n / 2 then incr goldbach_fail;
      n := !n + 2
    done;
    res := (count, sum, twins, one_mod_4, !goldbach_fail)
  done;
  let count, sum, twins, one_mod_4, fails = !res in
  Printf.printf "primes below %d: %d (sum mod p %d)\n" limit count sum;
  Printf.printf "twin pairs %d, 1 mod 4: %d, 3 mod 4: %d\n" twins one_mod_4 (count - one_mod_4 - 1);
  Printf.printf "goldbach failures up to %d: %d\n" (limit / 16) fails
