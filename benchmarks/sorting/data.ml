(* Deterministic pseudo-random test data. *)

type person = { age : int; score : float; id : int }

let generator seed =
  let s = ref seed in
  fun () ->
    s := ((!s * 25214903917) + 11) land 0xffffffffffff;
    (!s lsr 17) land 0x3fffffff

let ints n seed =
  let g = generator seed in
  Array.init n (fun _ -> g () mod 1_000_000)

let floats n seed =
  let g = generator seed in
  Array.init n (fun _ -> float (g ()) /. 1024.)

let people n seed =
  let g = generator seed in
  Array.init n (fun i -> { age = g () mod 90; score = float (g () mod 10000) /. 100.; id = i })

let compare_person a b =
  let c = compare a.age b.age in
  if c <> 0 then c else
    let c = Float.compare b.score a.score in
    if c <> 0 then c else compare a.id b.id
