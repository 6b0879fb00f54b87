(* Runs the same map and sparse-vector work on option arrays and on sentinel arrays
   and checks they agree. Arguments: number of operations, rounds. *)

module Int_sentinel = struct type t = int let sentinel = min_int let is_sentinel x = x = min_int end
module Float_sentinel = struct type t = float let sentinel = Float.nan let is_sentinel = Float.is_nan end
(* a string allocated once: physically distinct from every string the program stores *)
module Str_sentinel = struct
  type t = string
  let sentinel = Bytes.to_string (Bytes.of_string "<none>")
  let is_sentinel x = x == sentinel
end

module Work (K : Nullable.S with type elt = int) (V : Nullable.S with type elt = string) (F : Nullable.S with type elt = float) = struct
  module M = Table.Map (K) (V)
  module S = Table.Sparse (F)

  let run ~ops ~round =
    let m = M.create (4 * ops) in
    let s = ref (round + 1) in
    let rand n = s := ((!s * 1103515245) + 12345) land 0x3fffffff; (!s lsr 4) mod n in
    let hits = ref 0 and lens = ref 0 in
    for i = 1 to ops do
      let k = rand (2 * ops) in
      (match rand 4 with
       | 0 -> M.remove m k
       | 1 -> (match M.find m k with Some v -> incr hits; lens := !lens + String.length v | None -> ())
       | _ -> M.replace m k (if i land 7 = 0 then string_of_int i else "v"));
      ()
    done;
    let total = M.fold (fun acc k v -> (acc + k + String.length v) land 0x3fffffff) 0 m in
    let n = ops in
    let a = S.of_fn n (fun i -> if (i * 7 + round) mod 3 = 0 then Some (float (i mod 13) /. 4.) else None) in
    let b = S.of_fn n (fun i -> if (i + round) mod 5 <> 0 then Some (float (i mod 7) -. 3.) else None) in
    (m.M.size, !hits, !lens, total, S.dot a b, S.count a + S.count b)
end

module Boxed = Work (Nullable.Boxed (Int)) (Nullable.Boxed (String)) (Nullable.Boxed (Float))
module Flat = Work (Nullable.Flat (Int_sentinel)) (Nullable.Flat (Str_sentinel)) (Nullable.Flat (Float_sentinel))

let () =
  let ops = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 10000 in
  let rounds = if Array.length Sys.argv > 2 then int_of_string Sys.argv.(2) else 1 in
  let agree = ref true and last = ref (0, 0, 0, 0, 0., 0) and dots = ref 0. in
  for round = 1 to rounds do
    let r1 = Boxed.run ~ops ~round and r2 = Flat.run ~ops ~round in
    if r1 <> r2 then agree := false;
    let _, _, _, _, d, _ = r1 in
    dots := !dots +. d;
    last := r1
  done;
  let size, hits, lens, total, dot, present = !last in
  Printf.printf "ops %d rounds %d, representations agree %b\n" ops rounds !agree;
  Printf.printf "last round: %d keys, %d hits (%d chars), key/value sum %d\n" size hits lens total;
  Printf.printf "sparse: dot %.2f, %d present, sum of dots %.2f\n" dot present !dots
