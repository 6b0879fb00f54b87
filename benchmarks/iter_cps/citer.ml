(* Pull iterators in continuation-passing style: asking a stream for its next element
   means handing it two continuations, one for the end and one for an element and the
   rest of the stream. *)

type 'a t = { next : 'r. (unit -> 'r) -> ('a -> 'a t -> 'r) -> 'r }

let empty = { next = (fun nil _ -> nil ()) }

let range lo hi =
  let rec go i = { next = (fun nil cons -> if i > hi then nil () else cons i (go (i + 1))) } in
  go lo

let rec map f s = { next = (fun nil cons -> s.next nil (fun x s' -> cons (f x) (map f s'))) }

let rec filter p s =
  { next =
      (fun nil cons ->
        let rec loop s = s.next nil (fun x s' -> if p x then cons x (filter p s') else loop s') in
        loop s) }

let rec zip a b =
  { next = (fun nil cons -> a.next nil (fun x a' -> b.next nil (fun y b' -> cons (x, y) (zip a' b')))) }

let rec take n s =
  { next = (fun nil cons -> if n <= 0 then nil () else s.next nil (fun x s' -> cons x (take (n - 1) s'))) }

let rec take_while p s =
  { next = (fun nil cons -> s.next nil (fun x s' -> if p x then cons x (take_while p s') else nil ())) }

let rec append a b = { next = (fun nil cons -> a.next (fun () -> b.next nil cons) (fun x a' -> cons x (append a' b))) }

let rec flat_map f s =
  { next = (fun nil cons -> s.next nil (fun x s' -> (append (f x) (flat_map f s')).next nil cons)) }

let rec scan f acc s =
  { next =
      (fun nil cons ->
        s.next nil (fun x s' ->
          let acc = f acc x in
          cons acc (scan f acc s'))) }

let fold f acc s =
  let rec go acc s = s.next (fun () -> acc) (fun x s' -> go (f acc x) s') in
  go acc s

let length s = fold (fun n _ -> n + 1) 0 s

(* the stream of (previous, current) pairs *)
let pairs s =
  { next =
      (fun nil cons ->
        s.next nil (fun x0 s' -> (scan (fun (_, prev) x -> (prev, x)) (x0, x0) s').next nil cons)) }
