(* fannkuch-redux: maximum number of pancake flips over all permutations, and the
   alternating-sign checksum of the flip counts. *)

type stats = { checksum : int; max_flips : int; at_max : int; fixed_first : int }

let make_sink n =
  let scratch = Array.make n 0 in
  (module struct
    type t = stats
    let empty = { checksum = 0; max_flips = 0; at_max = 0; fixed_first = 0 }
    let visit s ~index p =
      let f = Perm.count_flips ~scratch p in
      let checksum = if index land 1 = 0 then s.checksum + f else s.checksum - f in
      let max_flips, at_max =
        if f > s.max_flips then (f, 1) else if f = s.max_flips then (f, s.at_max + 1) else (s.max_flips, s.at_max)
      in
      let fixed_first = if f = 0 then s.fixed_first + 1 else s.fixed_first in
      { checksum; max_flips; at_max; fixed_first }
  end : Enum.SINK with type t = stats)

let () =
  let n = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 7 in
  let module S = (val make_sink n) in
  let module F = Enum.Fold (S) in
  let limit = if Array.length Sys.argv > 2 then int_of_string Sys.argv.(2) else 0 in
  let r, visited = F.run ~limit n in
  Printf.printf "%d\nPfannkuchen(%d) = %d\n" r.checksum n r.max_flips;
  Printf.printf "permutations visited: %d\n" visited;
  Printf.printf "permutations reaching the maximum: %d, already sorted at the front: %d\n" r.at_max r.fixed_first
