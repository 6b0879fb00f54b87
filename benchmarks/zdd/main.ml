(* Counts domino tilings of every board up to W x H with ZDDs, splits them by the
   domino covering the corner with onset/union/intersection/difference, and counts
   them by number of horizontal dominoes. Arguments: W, H. *)

let () =
  let wmax = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 6 in
  let hmax = if Array.length Sys.argv > 2 then int_of_string Sys.argv.(2) else 8 in
  let boards = ref 0 and sum = ref 0 and nodes = ref 0 and bad = ref 0 in
  let report = ref [] in
  for w = 2 to wmax do
    for h = w to hmax do
      if w * h mod 2 = 0 then begin
        Zdd.reset ();
        let all = Tiling.build ~w ~h in
        let total = Zdd.count all in
        (* the top-left cell is covered by domino 0 (horizontal) or 1 (vertical) *)
        let with_h = Zdd.onset 0 all and with_v = Zdd.onset 1 all in
        let ok =
          Zdd.union with_h with_v == all
          && Zdd.inter with_h with_v == Zdd.Empty
          && Zdd.diff all with_h == with_v
          && Zdd.(count with_h +% count with_v) = total
        in
        if not ok then incr bad;
        let by_h = Zdd.count_by ~max_k:(w * h / 2) Tiling.horizontal all in
        let polysum = ref 0 in
        Array.iteri (fun k c -> polysum := (!polysum * 31 + (k + 1) * c) land max_int) by_h;
        if Array.fold_left Zdd.( +% ) 0 by_h <> total then incr bad;
        incr boards;
        sum := Zdd.(!sum +% total);
        nodes := !nodes + Zdd.size ();
        if w = wmax && (h = hmax || h = hmax - 1) then
          report :=
            Printf.sprintf "%dx%d: %d tilings (mod 1e9+7), %d with the corner horizontal, by-horizontals hash %d, %d nodes"
              w h total (Zdd.count with_h) !polysum (Zdd.size ())
            :: !report
      end
    done
  done;
  List.iter print_endline (List.rev !report);
  Printf.printf "%d boards, sum of counts %d, total nodes %d, failed checks %d\n" !boards !sum !nodes !bad
