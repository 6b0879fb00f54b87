(* Scalar fields for the generic linear algebra: floats, and integers modulo a prime. *)

module type S = sig
  type t
  val zero : t
  val one : t
  val of_int : int -> t
  val add : t -> t -> t
  val sub : t -> t -> t
  val mul : t -> t -> t
  val div : t -> t -> t
  val neg : t -> t
  val equal : t -> t -> bool
  (* a size measure used for pivoting and stopping tests *)
  val magnitude : t -> float
end

module Float : S with type t = float = struct
  type t = float
  let zero = 0.
  let one = 1.
  let of_int = float_of_int
  let add = ( +. )
  let sub = ( -. )
  let mul = ( *. )
  let div = ( /. )
  let neg x = -.x
  let equal (a : float) b = a = b
  let magnitude = Float.abs
end

module Modp (P : sig val p : int end) : S with type t = int = struct
  type t = int
  let p = P.p
  let norm x = let r = x mod p in if r < 0 then r + p else r
  let zero = 0
  let one = 1
  let of_int = norm
  let add a b = let s = a + b in if s >= p then s - p else s
  let sub a b = let s = a - b in if s < 0 then s + p else s
  let mul a b = a * b mod p
  let rec pow a e = if e = 0 then 1 else let h = pow (mul a a) (e / 2) in if e land 1 = 1 then mul a h else h
  let div a b = mul a (pow b (p - 2))
  let neg a = if a = 0 then 0 else p - a
  let equal (a : int) b = a = b
  let magnitude a = if a = 0 then 0. else 1.
end
