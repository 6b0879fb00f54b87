(* A composite key ordered by a hand-written comparison, used to build sets and maps. *)
type t = { tag : string; major : int; minor : int }

let compare a b =
  let c = Int.compare a.major b.major in
  if c <> 0 then c
  else
    let c = String.compare a.tag b.tag in
    if c <> 0 then c else Int.compare a.minor b.minor

let syllables = [| "ka"; "lo"; "mi"; "nu"; "pe"; "ri"; "so"; "tu" |]

let make seed =
  let s = (seed * 2654435761) land 0xffffffff in
  let tag = syllables.(s land 7) ^ syllables.((s lsr 3) land 7) ^ syllables.((s lsr 6) land 7) in
  { tag; major = (s lsr 9) mod 50; minor = (s lsr 15) mod 20 }

let weight k = String.length k.tag + (k.major * 3) + k.minor
