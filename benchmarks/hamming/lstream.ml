(* Infinite lazy streams: the tail is a suspension forced on demand. *)

type 'a t = Cons of 'a * 'a t Lazy.t

let hd (Cons (x, _)) = x
let tl (Cons (_, r)) = Lazy.force r
let rec map f (Cons (x, r)) = Cons (f x, lazy (map f (Lazy.force r)))

(* merge two increasing streams, dropping duplicates *)
let rec merge cmp (Cons (x, r1) as s1) (Cons (y, r2) as s2) =
  let c = cmp x y in
  if c < 0 then Cons (x, lazy (merge cmp (Lazy.force r1) s2))
  else if c > 0 then Cons (y, lazy (merge cmp s1 (Lazy.force r2)))
  else Cons (x, lazy (merge cmp (Lazy.force r1) (Lazy.force r2)))

let rec nth s n = if n = 0 then hd s else nth (tl s) (n - 1)

let fold_prefix n f acc s =
  let rec go k acc s = if k = 0 then acc else go (k - 1) (f acc (hd s)) (tl s) in
  go n acc s

(* the stream x0, f x0, f (f x0), ... *)
let rec iterate f x = Cons (x, lazy (iterate f (f x)))
