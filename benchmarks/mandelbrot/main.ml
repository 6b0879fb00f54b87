(* mandelbrot: the set over [-1.5, 0.5] x [-1, 1] as an n x n bitmap; prints pixel
   counts and a checksum of the PBM bytes instead of the image. *)

let () =
  let n = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 200 in
  let limit = 50 in
  let bm = Bitmap.create n n in
  let fn = float n in
  let rows_in = Array.make n 0 in
  for y = 0 to n - 1 do
    let ci = (2. *. float y /. fn) -. 1. in
    Bitmap.fill_row bm y (fun x ->
        let inside = Cplx.in_set ~limit (Cplx.make ((2. *. float x /. fn) -. 1.5) ci) in
        if inside then rows_in.(y) <- rows_in.(y) + 1;
        inside)
  done;
  let widest = Array.fold_left max 0 rows_in in
  Printf.printf "%dx%d, %d iterations\n" n n limit;
  Printf.printf "pixels in the set: %d (widest row %d)\n" (Bitmap.count_set bm) widest;
  Printf.printf "pbm checksum %012x\n" (Bitmap.checksum bm)
