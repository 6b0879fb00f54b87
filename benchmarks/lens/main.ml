(* Applies a long sequence of updates through composed lenses to an immutable nested
   record and prints checksums of the result. *)
open Lens
open Model

let teams = [| north |-- alpha; north |-- beta; south |-- alpha; south |-- beta |]

(* update paths chosen by the step number *)
let updates =
  [| (fun i c -> modify (teams.(i land 3) |-- lead |-- salary) (fun s -> ((s * 3) + i) mod 100_003) c);
     (fun i c -> modify (teams.((i lsr 2) land 3) |-- budget) (fun b -> (b + (i mod 17)) land 0xffffff) c);
     (fun i c -> modify (teams.(i land 3) |-- members |-- nth (i mod 4) |-- rating) (fun r -> (r *. 0.75) +. float (i mod 7)) c);
     (fun i c -> modify (teams.((i + 1) land 3) |-- members |-- nth ((i / 3) mod 4) |-- home |-- zip) (fun z -> (z + i) mod 99_991) c);
     (fun i c -> modify (both revenue (hq |-- street)) (fun (r, s) -> ((r + s) land 0xffffff, (s * 5 + 1) mod 1009)) c);
     (fun i c -> modify (south |-- code) (fun k -> (k * 7 + i) mod 65_521) c) |]

let checksum c =
  let team_sum t =
    Array.fold_left (fun acc e -> acc + e.salary + e.home.zip + int_of_float (e.rating *. 100.)) (t.lead.salary + t.budget) t.members
  in
  Array.fold_left (fun acc l -> (acc * 31 + team_sum (get l c)) land 0x3fffffff) (c.revenue + c.hq.street + c.south.code) teams

let () =
  let steps = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 1000 in
  let c = ref initial in
  for i = 1 to steps do
    c := updates.(i mod Array.length updates) i !c
  done;
  let c = !c in
  Printf.printf "steps %d checksum %d\n" steps (checksum c);
  Printf.printf "north alpha lead salary %d, south beta budget %d, revenue %d\n"
    (get (north |-- alpha |-- lead |-- salary) c) (get (south |-- beta |-- budget) c) c.revenue;
  Printf.printf "rating %.6f\n" (get (south |-- alpha |-- members |-- nth 2 |-- rating) c)
