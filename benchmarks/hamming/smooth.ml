(* Numbers whose prime factors all lie in a given set, in increasing order, defined as
   a stream in terms of itself (Dijkstra's construction generalised to any primes). *)

let numbers primes =
  let rec rest =
    lazy
      (match List.map (fun p -> Lstream.map (fun x -> x * p) whole) primes with
       | [] -> invalid_arg "Smooth.numbers: no primes"
       | first :: others -> List.fold_left (Lstream.merge compare) first others)
  and whole = Lstream.Cons (1, rest) in
  whole
