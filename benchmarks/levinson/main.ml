(* Linear prediction of a synthetic AR(4) signal frame by frame: autocorrelation,
   Levinson-Durbin, averaged coefficients; plus Toeplitz solves checked by multiplication. *)

let () =
  let frames = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 100 in
  let len = 400 and order = 10 and tsize = 120 in
  let truth = [| 1.2; -0.9; 0.35; -0.1 |] in
  let g = Signal.rng 77 in
  let x = Signal.ar_process g truth ((frames * len / 2) + len) in
  let mean = Array.make order 0. and err = ref 0. and stable = ref 0 and worst = ref 0. in
  for f = 0 to frames - 1 do
    let w = Signal.windowed x (f * len / 2) len Signal.triangle in
    let r = Signal.autocorrelation w tsize in
    let lpc = Toeplitz.durbin r order in
    Array.iteri (fun k a -> mean.(k) <- mean.(k) +. (a /. float_of_int frames)) lpc.Toeplitz.coeffs;
    err := !err +. (lpc.Toeplitz.error /. r.(0));
    if Array.for_all (fun k -> Float.abs k < 1.) lpc.Toeplitz.reflection then incr stable;
    (* a bigger Toeplitz system from the same autocorrelation, diagonally loaded *)
    let t = Array.mapi (fun i v -> if i = 0 then v *. 1.05 else v) (Array.sub r 0 tsize) in
    let b = Array.init tsize (fun i -> float_of_int ((i * 7) mod 11) -. 5.) in
    let sol = Toeplitz.solve t b in
    let back = Toeplitz.mul t sol in
    Array.iteri (fun i v -> worst := Float.max !worst (Float.abs (v -. b.(i)) /. 10.)) back
  done;
  Printf.printf "frames %d order %d stable %d\n" frames order !stable;
  Printf.printf "mean coefficients";
  Array.iter (fun a -> Printf.printf " %.3f" a) mean;
  print_newline ();
  Printf.printf "mean normalised prediction error %.4f\n" (!err /. float_of_int frames);
  Printf.printf "toeplitz %dx%d residual below 1e-8: %b\n" tsize tsize (!worst < 1e-8)
