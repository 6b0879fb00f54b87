(* Hamming numbers and their generalisations for several prime sets, rebuilt from
   scratch [reps] times. *)

let sets = [ ([ 2; 3; 5 ], 10000); ([ 2; 3; 5; 7 ], 8000); ([ 2; 3 ], 800); ([ 3; 5; 7; 11 ], 2000) ]
let modulus = 1_000_000_007

let () =
  let reps = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 1 in
  let results = ref [] in
  for _ = 1 to reps do
    results :=
      List.map
        (fun (primes, count) ->
          let s = Smooth.numbers primes in
          let sum = Lstream.fold_prefix count (fun acc x -> (acc + (x mod modulus)) mod modulus) 0 s in
          (primes, count, Lstream.nth s (count - 1), sum))
        sets
  done;
  List.iter
    (fun (primes, count, last, sum) ->
      Printf.printf "{%s}: number %d is %d, sum mod p %d\n"
        (String.concat "," (List.map string_of_int primes)) count last sum)
    !results;
  let powers = Lstream.iterate (fun x -> 2 * x) 1 in
  Printf.printf "2^40 = %d\n" (Lstream.nth powers 40)
