(* Orderings as modules: a signature, a few instances and combinators. *)

module type S = sig
  type t
  val compare : t -> t -> int
end

module Int_asc = struct
  type t = int
  let compare (a : int) b = if a < b then -1 else if a > b then 1 else 0
end

module Float_asc = struct
  type t = float
  let compare (a : float) b = if a < b then -1 else if a > b then 1 else 0
end

module Rev (O : S) = struct
  type t = O.t
  let compare a b = O.compare b a
end

module Lex (A : S) (B : S) = struct
  type t = A.t * B.t
  let compare (a1, b1) (a2, b2) =
    let c = A.compare a1 a2 in
    if c <> 0 then c else B.compare b1 b2
end

(* orders by a derived key *)
module By (K : S) (X : sig type t val key : t -> K.t end) = struct
  type t = X.t
  let compare a b = K.compare (X.key a) (X.key b)
end
