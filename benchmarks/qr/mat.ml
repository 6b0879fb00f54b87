(* Column-major dense matrices: column j is a contiguous slice of [data]. *)

type t = { m : int; n : int; data : float array }

let create m n = { m; n; data = Array.make (m * n) 0. }
let init m n f = { m; n; data = Array.init (m * n) (fun k -> f (k mod m) (k / m)) }
let get a i j = Array.unsafe_get a.data ((j * a.m) + i)
let set a i j v = Array.unsafe_set a.data ((j * a.m) + i) v
let copy a = { a with data = Array.copy a.data }

(* sum over rows lo..m-1 of f i *)
let sum_rows lo hi f =
  let s = ref 0. in
  for i = lo to hi - 1 do s := !s +. f i done;
  !s

let mul_vec a x = Array.init a.m (fun i -> sum_rows 0 a.n (fun j -> get a i j *. x.(j)))
