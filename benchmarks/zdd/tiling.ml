(* Domino tilings of a w x h board as a ZDD over placements. Cell (r, c) is r*w + c;
   the domino whose first cell is p has variable 2p (horizontal, p and p+1) or 2p+1
   (vertical, p and p+w). Built cell by cell in row-major order; the state is the
   first cell not yet decided and a mask of the w+1 cells from there on that are
   already covered, so each state's family is built once. *)

let horizontal v = v land 1 = 0

let build ~w ~h =
  let cells = w * h in
  let memo = Hashtbl.create 4096 in
  let rec fam p mask =
    if p = cells then (if mask = 0 then Zdd.Base else Zdd.Empty)
    else if mask land 1 = 1 then fam (p + 1) (mask lsr 1)
    else begin
      let key = (p lsl (w + 1)) lor mask in
      match Hashtbl.find_opt memo key with
      | Some z -> z
      | None ->
        let hor =
          if p mod w < w - 1 && mask land 2 = 0 then fam (p + 1) ((mask lor 3) lsr 1) else Zdd.Empty
        in
        let ver =
          if p + w < cells then fam (p + 1) ((mask lor 1 lor (1 lsl w)) lsr 1) else Zdd.Empty
        in
        let z = Zdd.node (2 * p) (Zdd.node ((2 * p) + 1) Zdd.Empty ver) hor in
        Hashtbl.add memo key z;
        z
    end
  in
  fam 0 0
