(* Backtracking search of chain conformations: each nucleotide is placed by one of the
   candidate step transforms; placements that clash with earlier non-neighbours or break a
   pairing constraint are pruned. Counts solutions for several sequences. *)

exception Enough

type state = { frames : Tfo.t array; atoms : Tfo.pt array array }

let search seq ~limit =
  let n = String.length seq in
  let bases = Array.init n (fun i -> Nuc.base_of_char seq.[i]) in
  let templates = Array.map Nuc.template bases in
  (* hairpin: i pairs with n-1-i when the bases can pair and the stem is long enough apart *)
  let partner = Array.init n (fun j -> let i = n - 1 - j in if i < j - 3 && Nuc.pairs_with bases.(i) bases.(j) then i else -1) in
  let st = { frames = Array.make n Tfo.identity; atoms = Array.make n [||] } in
  st.atoms.(0) <- templates.(0);
  let solutions = ref 0 and spread = ref 0. and nodes = ref 0 in
  let fits j atoms =
    let ok = ref true and i = ref 0 in
    while !ok && !i < j - 1 do
      let other = st.atoms.(!i) in
      ok := Array.for_all (fun p -> Array.for_all (fun q -> Tfo.dist2 p q >= Nuc.clash2) other) atoms;
      incr i
    done;
    !ok
    && (partner.(j) < 0
       || let d = Tfo.dist2 atoms.(0) st.atoms.(partner.(j)).(0) in
          d >= Nuc.pair_lo2 && d <= Nuc.pair_hi2)
  in
  let rec place j =
    if j = n then begin
      incr solutions;
      spread := !spread +. Tfo.dist2 st.atoms.(0).(0) st.atoms.(n - 1).(0);
      if !solutions >= limit then raise Enough
    end else
      Array.iter
        (fun step ->
          incr nodes;
          let frame = Tfo.compose st.frames.(j - 1) step in
          let atoms = Array.map (Tfo.apply frame) templates.(j) in
          if fits j atoms then begin
            st.frames.(j) <- frame;
            st.atoms.(j) <- atoms;
            place (j + 1)
          end)
        Nuc.steps
  in
  (try place 1 with Enough -> ());
  (!solutions, !nodes, if !solutions = 0 then 0. else !spread /. float_of_int !solutions)

let () =
  let len = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 8 in
  let count = if Array.length Sys.argv > 2 then int_of_string Sys.argv.(2) else 4 in
  let st = ref 5 in
  let total = ref 0 and total_nodes = ref 0 in
  for k = 1 to count do
    let seq = String.init len (fun _ -> st := ((!st * 1103515245) + 12345) land 0x7fffffff; "ACGU".[(!st lsr 16) land 3]) in
    let sols, nodes, spread = search seq ~limit:max_int in
    total := !total + sols;
    total_nodes := !total_nodes + nodes;
    if k <= 6 then Printf.printf "%s: %d conformations, mean end-to-end^2 %.3f\n" seq sols spread
  done;
  Printf.printf "%d sequences of length %d: %d conformations, %d placements tried\n" count len !total !total_nodes
