(* A grid updated through a higher-order function: inlined, the closure is known and its
   float arithmetic unboxed; out of line, every cell allocates. *)
type t = { w : int; h : int; cells : float array; mutable writes : int }

let make w h = { w; h; cells = Array.make (w * h) 1.0; writes = 0 }

let describe g i j =
  Printf.sprintf "(%d, %d) outside %dx%d after %d writes (%s, %s)" i j g.w g.h g.writes
    (if i < 0 then "row below" else if i >= g.h then "row above" else "row inside")
    (if j < 0 then "column below" else if j >= g.w then "column above" else "column inside")

let update g i j f =
  if i < 0 || i >= g.h || j < 0 || j >= g.w then begin
    prerr_endline (describe g i j);
    prerr_endline (describe g j i);
    prerr_endline (describe g (i + 1) (j + 1));
    invalid_arg (describe g i j)
  end;
  let k = i * g.w + j in
  let v = f g.cells.(k) in
  if Float.is_nan v then invalid_arg (describe g i j ^ Printf.sprintf " gave %f" v);
  g.cells.(k) <- v;
  g.writes <- g.writes + 1

let sum g = Array.fold_left ( +. ) 0.0 g.cells
