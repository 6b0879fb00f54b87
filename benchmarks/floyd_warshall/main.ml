(* All-pairs shortest paths, widest paths and reachability on a random graph, with
   shortest paths reconstructed and re-costed. *)

let () =
  let n = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 100 in
  let g = Graph.generate ~n ~degree:4 ~seed:99 in
  let sp = Fw.run Fw.min_plus g (fun w -> w) in
  let finite = ref 0 and total = ref 0 in
  Array.iter (Array.iter (fun d -> if d <> max_int then (incr finite; total := !total + d))) sp.Fw.dist;
  Printf.printf "n %d reachable pairs %d distance sum %d\n" n !finite !total;
  (* re-cost every reconstructed path from vertex u to all others *)
  let ok = ref 0 and hops = ref 0 in
  for u = 0 to n - 1 do
    if u mod 7 = 0 then
      for v = 0 to n - 1 do
        match Fw.path sp u v with
        | None -> ()
        | Some p ->
            let rec cost = function
              | a :: (b :: _ as rest) -> (match Graph.edge g a b with Some w -> w | None -> max_int / 4) + cost rest
              | _ -> 0
            in
            hops := !hops + List.length p - 1;
            if cost p = sp.Fw.dist.(u).(v) then incr ok
      done
  done;
  Printf.printf "paths checked %d total hops %d\n" !ok !hops;
  let wp = Fw.run Fw.max_min g (fun w -> w) in
  let wsum = Array.fold_left (Array.fold_left ( + )) 0 (Array.map (Array.map (fun w -> if w = max_int then 0 else w)) wp.Fw.dist) in
  Printf.printf "widest path capacity sum %d\n" wsum;
  let reach = Fw.run Fw.boolean g (fun _ -> true) in
  let count = Array.fold_left (fun c row -> Array.fold_left (fun c b -> if b then c + 1 else c) c row) 0 reach.Fw.dist in
  Printf.printf "transitive closure pairs %d (agrees %b)\n" count (count = !finite)
