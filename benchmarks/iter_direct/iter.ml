(* Pull iterators in direct style: a stream is a function returning its next node. *)

type 'a t = unit -> 'a node
and 'a node = Nil | Cons of 'a * 'a t

let empty () = Nil

let range lo hi =
  let rec go i () = if i > hi then Nil else Cons (i, go (i + 1)) in
  go lo

let rec map f s () = match s () with Nil -> Nil | Cons (x, s') -> Cons (f x, map f s')

let rec filter p s () =
  match s () with Nil -> Nil | Cons (x, s') -> if p x then Cons (x, filter p s') else filter p s' ()

let rec zip a b () =
  match a () with
  | Nil -> Nil
  | Cons (x, a') -> ( match b () with Nil -> Nil | Cons (y, b') -> Cons ((x, y), zip a' b'))

let rec take n s () = if n <= 0 then Nil else match s () with Nil -> Nil | Cons (x, s') -> Cons (x, take (n - 1) s')

let rec take_while p s () =
  match s () with Nil -> Nil | Cons (x, s') -> if p x then Cons (x, take_while p s') else Nil

let rec append a b () = match a () with Nil -> b () | Cons (x, a') -> Cons (x, append a' b)
let rec flat_map f s () = match s () with Nil -> Nil | Cons (x, s') -> append (f x) (flat_map f s') ()

let rec scan f acc s () =
  match s () with
  | Nil -> Nil
  | Cons (x, s') ->
      let acc = f acc x in
      Cons (acc, scan f acc s')

let fold f acc s =
  let rec go acc s = match s () with Nil -> acc | Cons (x, s') -> go (f acc x) s' in
  go acc s

let length s = fold (fun n _ -> n + 1) 0 s

(* the stream of (previous, current) pairs *)
let pairs s () =
  match s () with
  | Nil -> Nil
  | Cons (x0, s') -> scan (fun (_, prev) x -> (prev, x)) (x0, x0) s' ()
