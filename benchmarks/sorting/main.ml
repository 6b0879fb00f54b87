(* Sorts integers, floats and records with every algorithm and checks they agree. *)

module I = Sorts.Make (Int)
module F = Sorts.Make (Float)
module P = Sorts.Make (struct type t = Data.person let compare = Data.compare_person end)

let checksum f a = Array.fold_left (fun (i, acc) x -> (i + 1, (acc * 31 + (i * f x)) land 0xffffffff)) (0, 7) a |> snd

let () =
  let n = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 10000 in
  let reps = if Array.length Sys.argv > 2 then int_of_string Sys.argv.(2) else 1 in
  let agree = ref true and sums = ref (0, 0, 0) in
  for r = 1 to reps do
    let xs = Data.ints n r in
    let q = Array.copy xs and h = Array.copy xs in
    I.quicksort q;
    I.heapsort h;
    let m = Array.of_list (I.merge_sort (Array.to_list xs)) in
    let by = Array.of_list (Sorts.merge_sort_by (fun a b -> compare b a) (Array.to_list xs)) in
    let qb = Sorts.quicksort_by compare (Array.to_list (Array.sub xs 0 (min n 2000))) in
    agree := !agree && q = h && h = m && I.is_sorted q && by.(0) = q.(n - 1)
             && qb = List.sort compare (Array.to_list (Array.sub xs 0 (min n 2000)));
    let fs = Data.floats n (r + 100) in
    let fq = Array.copy fs and fh = Array.copy fs in
    F.quicksort fq;
    F.heapsort fh;
    agree := !agree && fq = fh && F.is_sorted fq;
    let ps = Data.people (n / 2) (r + 200) in
    let pq = Array.copy ps and ph = Array.copy ps in
    P.quicksort pq;
    P.heapsort ph;
    let pm = Array.of_list (P.merge_sort (Array.to_list ps)) in
    agree := !agree && pq = ph && ph = pm;
    let a, b, c = !sums in
    sums :=
      ( (a + checksum (fun x -> x) q) land 0xffffffff,
        (b + checksum (fun x -> int_of_float x) fq) land 0xffffffff,
        (c + checksum (fun p -> p.Data.id) pq) land 0xffffffff )
  done;
  let a, b, c = !sums in
  Printf.printf "n %d reps %d: all sorts agree: %b\n" n reps !agree;
  Printf.printf "checksums %d %d %d\n" a b c
