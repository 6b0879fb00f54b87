(* spectral-norm: the largest singular value of the n x n truncation of the matrix
   a(i,j) = 1 / ((i+j)(i+j+1)/2 + i + 1), by the power method on A^T A. *)

let spectral_norm n iterations =
  let ata = Operator.compose (Operator.transpose n) (Operator.matrix n) in
  let u = Array.make n 1. and v = Array.make n 0. in
  for _ = 1 to iterations do
    Operator.apply ata u v;
    Operator.apply ata v u
  done;
  (sqrt (Vec.dot u v /. Vec.norm2 v), Vec.dot u u)

let () =
  let n = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 100 in
  let steps = [ 3; 10 ] in
  List.iter
    (fun it ->
      let s, uu = spectral_norm n it in
      Printf.printf "n %d iterations %d: %.9f (|u|^2 %.4e)\n" n it s uu)
    steps
