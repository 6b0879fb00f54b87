(* Functional lenses: a getter and a functional setter, composed with closures. *)

type ('s, 'a) t = { get : 's -> 'a; set : 'a -> 's -> 's }

let make get set = { get; set }
let get l s = l.get s
let set l a s = l.set a s
let modify l f s = l.set (f (l.get s)) s

let compose outer inner =
  { get = (fun s -> inner.get (outer.get s));
    set = (fun a s -> outer.set (inner.set a (outer.get s)) s) }

let ( |-- ) = compose
let id = { get = (fun s -> s); set = (fun a _ -> a) }
let first = { get = fst; set = (fun a (_, b) -> (a, b)) }
let second = { get = snd; set = (fun b (a, _) -> (a, b)) }

(* two lenses on disjoint parts viewed as one lens onto a pair *)
let both l1 l2 = { get = (fun s -> (l1.get s, l2.get s)); set = (fun (a, b) s -> l2.set b (l1.set a s)) }

(* the i-th element of an immutable array (copy on write) *)
let nth i =
  { get = (fun a -> a.(i));
    set = (fun x a -> let a' = Array.copy a in a'.(i) <- x; a') }
