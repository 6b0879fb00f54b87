(* List-heavy workloads: pipelines of maps and filters, run-length coding, grouping,
   permutations, merging and sliding windows. *)
open Listx

let () =
  let n = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 1000 in
  let reps = if Array.length Sys.argv > 2 then int_of_string Sys.argv.(2) else 1 in
  let h = ref 0 in
  for r = 1 to reps do
    let xs = List.map (fun i -> (i * i + r) mod 1009) (range 1 n) in
    let evens = List.filter (fun x -> x land 1 = 0) xs in
    let pipeline = xs |> List.map (fun x -> x * 3) |> List.filter (fun x -> x mod 7 <> 0) |> List.rev_map (fun x -> x + 1) in
    let runs = encode (List.map (fun x -> x / 100) (List.sort compare xs)) in
    assert (decode runs = List.map (fun x -> x / 100) (List.sort compare xs));
    let groups = group_by (fun x -> x mod 13) xs in
    let perms = permutations (range 1 (5 + (r mod 3))) in
    let merged = merge compare (List.sort compare evens) (List.sort compare pipeline) in
    let win = windows 4 (take 200 xs) |> List.map sum in
    let assoc = List.combine (take 100 xs) (drop (n - 100) xs) in
    let parts = [ hash_list xs; sum evens; hash_list pipeline; List.length runs;
                  sum (List.map (fun (k, g) -> k * List.length g) groups);
                  List.length perms; hash_list (List.map hash_list perms);
                  hash_list merged; hash_list win;
                  sum (List.map (fun (a, b) -> a * b) assoc) ] in
    h := hash_list (!h :: parts)
  done;
  Printf.printf "n %d reps %d hash %d\n" n reps !h
