(* Sets and maps over custom keys built with Set.Make and Map.Make: unions,
   intersections, differences, counting with Map.update, folds and range queries. *)

module KS = Set.Make (Key)
module KM = Map.Make (Key)
module IM = Map.Make (Int)

let () =
  let n = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 10000 in
  let reps = if Array.length Sys.argv > 2 then int_of_string Sys.argv.(2) else 1 in
  let out = ref (0, 0, 0, 0, 0) in
  for r = 1 to reps do
    let keys = List.init n (fun i -> Key.make ((i * 7) + r)) in
    let a = KS.of_list keys in
    let b = List.fold_left (fun s i -> KS.add (Key.make (i * 11)) s) KS.empty (List.init n Fun.id) in
    let u = KS.union a b and i = KS.inter a b and d = KS.diff a b in
    let counts = List.fold_left (fun m k -> KM.update k (function None -> Some 1 | Some c -> Some (c + 1)) m) KM.empty keys in
    let by_major =
      KM.fold (fun k c m -> IM.update k.Key.major (fun v -> Some (c + Option.value v ~default:0)) m) counts IM.empty
    in
    let heavy = KM.filter (fun k c -> c > 1 || Key.weight k > 60) counts in
    let lookups = List.fold_left (fun acc k -> if KS.mem k b then acc + 1 else acc) 0 keys in
    let range = KS.filter (fun k -> k.Key.major >= 10 && k.Key.major < 20) u in
    let total_weight = KS.fold (fun k acc -> acc + Key.weight k) i 0 in
    out :=
      ( KS.cardinal u, KS.cardinal i + KS.cardinal d,
        IM.fold (fun k v acc -> (acc * 31 + (k * v)) land 0xffffff) by_major 0,
        KM.cardinal heavy + lookups, KS.cardinal range * 1000 + total_weight mod 1000 )
  done;
  let a, b, c, d, e = !out in
  Printf.printf "n %d reps %d\n" n reps;
  Printf.printf "union %d, inter+diff %d, histogram %d, heavy+lookups %d, range %d\n" a b c d e;
  (match KS.min_elt_opt (KS.of_list (List.init 100 Key.make)) with
   | Some k -> Printf.printf "min key %s/%d/%d\n" k.Key.tag k.Key.major k.Key.minor
   | None -> ())
