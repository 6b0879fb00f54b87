(* Small vector helpers over float arrays. *)

let fold2 f init a b =
  let acc = ref init in
  for i = 0 to Array.length a - 1 do acc := f !acc (Array.unsafe_get a i) (Array.unsafe_get b i) done;
  !acc

let dot a b = fold2 (fun s x y -> s +. (x *. y)) 0. a b
let norm2 a = dot a a
let fill a v = Array.fill a 0 (Array.length a) v
