(* Sums several series with naive, Kahan, Neumaier, Klein and pairwise summation. *)

module Dn = Summation.Driver (Summation.Naive)
module Dk = Summation.Driver (Summation.Kahan)
module Dm = Summation.Driver (Summation.Neumaier)
module Dl = Summation.Driver (Summation.Klein)

let () =
  let n = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 100000 in
  let total_gap = ref 0. in
  List.iter
    (fun s ->
      let f = s.Series.term in
      let naive = Dn.over_fn n f and kahan = Dk.over_fn n f in
      let neum = Dm.over_fn n f and klein = Dl.over_fn n f in
      let arr = Array.init n (fun i -> f (i + 1)) in
      let pair = Summation.pairwise arr 0 n in
      let arr_kahan = Dk.over_array arr in
      if arr_kahan <> kahan then print_endline "kahan mismatch";
      total_gap := !total_gap +. Float.abs (naive -. klein);
      Printf.printf "%-9s naive %.15e kahan %.15e neumaier %.15e klein %.15e pairwise %.15e\n"
        s.Series.name naive kahan neum klein pair)
    Series.all;
  Printf.printf "n = %d, total naive error %.6e\n" n !total_gap
