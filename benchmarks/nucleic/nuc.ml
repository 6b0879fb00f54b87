(* Nucleotides as rigid atom templates in a local frame, the candidate step
   conformations between consecutive nucleotides, and the constraints of a chain. *)

type base = A | C | G | U

(* backbone atoms first (phosphorus at index 0), then base atoms that depend on the type *)
let template base =
  let backbone = [ Tfo.pt 0. 0. 0.; Tfo.pt 1.4 0.3 0.2; Tfo.pt 1.9 1.5 (-0.4) ] in
  let ring = match base with
    | A -> [ Tfo.pt 3.0 2.2 0.; Tfo.pt 4.3 2.0 0.4; Tfo.pt 4.9 3.1 0.8 ]
    | G -> [ Tfo.pt 3.0 2.2 0.; Tfo.pt 4.4 2.4 0.3; Tfo.pt 5.2 3.3 0.9 ]
    | C -> [ Tfo.pt 3.1 2.0 0.1; Tfo.pt 4.0 2.9 0.2 ]
    | U -> [ Tfo.pt 3.1 2.0 0.1; Tfo.pt 3.9 3.0 (-0.2) ] in
  Array.of_list (backbone @ ring)

let base_of_char = function 'A' -> A | 'C' -> C | 'G' -> G | _ -> U

let pairs_with a b = match (a, b) with A, U | U, A | G, C | C, G | G, U | U, G -> true | _ -> false

(* Candidate transforms from one nucleotide's frame to the next one's. *)
let steps =
  let rotations = [ (2., 1., 0., 0.); (2., 0., 1., 0.); (2., 0., 0., 1.); (2., -1., 0., 0.);
                    (2., 0., -1., 0.); (2., 0., 0., -1.); (3., 1., 1., 0.); (3., 0., -1., 1.) ] in
  Array.of_list (List.map (fun q -> Tfo.of_quaternion q (1.0, 0.5, 3.0)) rotations)

let clash2 = 3.0 *. 3.0            (* atoms of non-neighbours must be at least this far apart *)
let pair_lo2 = 4.0 *. 4.0           (* paired bases: phosphorus distance window *)
let pair_hi2 = 11.0 *. 11.0
