(* Sieve of Eratosthenes over odd numbers, and queries on it through closures. *)

type t = { limit : int; odd : Bitset.t (* bit k stands for 2k+1 *) }

let sieve limit =
  let half = (limit + 1) / 2 in
  let odd = Bitset.create half true in
  Bitset.clear odd 0;
  let k = ref 1 in
  while ((2 * !k) + 1) * ((2 * !k) + 1) <= limit do
    if Bitset.mem odd !k then begin
      let p = (2 * !k) + 1 in
      let j = ref ((p * p) / 2) in
      while !j < half do
        Bitset.clear odd !j;
        j := !j + p
      done
    end;
    incr k
  done;
  { limit; odd }

let is_prime s n = n = 2 || (n > 2 && n land 1 = 1 && n <= s.limit && Bitset.mem s.odd (n / 2))

let fold f s acc =
  let acc = if s.limit >= 2 then f 2 acc else acc in
  Bitset.fold_set (fun k acc -> let p = (2 * k) + 1 in if p <= s.limit then f p acc else acc) s.odd acc

let count_if pred s = fold (fun p n -> if pred p then n + 1 else n) s 0
