(* k-nucleotide: frequencies of all 1- and 2-mers, counts of a few longer k-mers, and
   summaries of the whole k-mer tables for several k. *)

let frequencies s k =
  let tbl = Counter.count s k in
  let total = float_of_int (String.length s - k + 1) in
  let items = Counter.sorted k tbl in
  Printf.printf "%d-mers:" k;
  List.iter (fun (m, c) -> Printf.printf " %s %.3f" m (100. *. float_of_int c /. total)) items;
  print_newline ()

let specific s pattern =
  let k = String.length pattern in
  let tbl = Counter.count s k in
  Printf.printf "%d\t%s\n" (Counter.get tbl (Dna.encode pattern)) pattern

let table_summary s k =
  let tbl = Counter.count s k in
  let items = Counter.sorted k tbl in
  let distinct = List.length items in
  let top, c = List.hd items in
  let singles = List.length (List.filter (fun (_, c) -> c = 1) items) in
  Printf.printf "k=%d distinct %d singletons %d top %s x%d\n" k distinct singles top c

let () =
  let n = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 100000 in
  let s = Dna.generate n in
  frequencies s 1;
  frequencies s 2;
  List.iter (specific s) [ "GGT"; "GGTA"; "GGTATT"; "GGTATTTTAATT"; "GGTATTTTAATTTATAGT" ];
  List.iter (table_summary s) [ 6; 8 ]
