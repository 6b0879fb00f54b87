(* Fixed-size bit sets over Bytes. *)
type t = { bits : Bytes.t; size : int }

let create size v = { bits = Bytes.make ((size + 7) / 8) (if v then '\255' else '\000'); size }
let mem s i = Char.code (Bytes.unsafe_get s.bits (i lsr 3)) land (1 lsl (i land 7)) <> 0

let clear s i =
  let b = i lsr 3 in
  Bytes.unsafe_set s.bits b (Char.unsafe_chr (Char.code (Bytes.unsafe_get s.bits b) land lnot (1 lsl (i land 7))))

let iter_set f s = for i = 0 to s.size - 1 do if mem s i then f i done
let fold_set f s acc = let acc = ref acc in iter_set (fun i -> acc := f i !acc) s; !acc
