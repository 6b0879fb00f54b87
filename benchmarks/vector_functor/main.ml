(* Applies the vector functor to float, modular, dual and complex elements and runs the
   same numeric work on each. Arguments: vector length, rounds. *)

module Work (E : Elt.S) = struct
  module V = Vec.Make (E)

  (* small coefficients derived from i, the same for every element type *)
  let coeff i = E.of_int ((i * 37 mod 11) - 5)

  let run ~n ~rounds ~point =
    let a = V.init n coeff in
    let b = V.init n (fun i -> coeff (i + 3)) in
    let acc = ref E.zero in
    for r = 1 to rounds do
      let k = E.of_int (r mod 7 - 3) in
      let c = V.axpy k a b in
      let c = V.smooth (V.smooth c) in
      acc := E.add !acc (V.dot c a);
      acc := E.sub !acc (V.horner (V.scale k b) point)
    done;
    let prod = V.convolve a b in
    let at = V.horner prod point in
    let check = E.sub at (E.mul (V.horner a point) (V.horner b point)) in
    let ok = E.magnitude check <= 1e-6 *. (1. +. E.magnitude at) in
    Printf.printf "%-8s acc %s product(x) %s residual %s\n" E.name (E.digest !acc) (E.digest at)
      (if ok then "ok" else "LARGE")
end

let () =
  let n = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 1000 in
  let rounds = if Array.length Sys.argv > 2 then int_of_string Sys.argv.(2) else 10 in
  let module W1 = Work (Elt.F64) in
  let module W2 = Work (Elt.Modp) in
  let module W3 = Work (Elt.Dual) in
  let module W4 = Work (Elt.Cplx) in
  W1.run ~n ~rounds ~point:(-0.999);
  W2.run ~n ~rounds ~point:123456;
  W3.run ~n ~rounds ~point:(-0.999, 1.);
  W4.run ~n ~rounds ~point:{ Complex.re = 0.6; im = -0.79 };
  Printf.printf "n %d rounds %d\n" n rounds
