(* Fields the factorisation is generic over: floats, and integers modulo a prime. *)

module type S = sig
  type t
  val zero : t
  val one : t
  val add : t -> t -> t
  val sub : t -> t -> t
  val mul : t -> t -> t
  val div : t -> t -> t
  val of_int : int -> t
  val is_zero : t -> bool
end

module Float_field : S with type t = float = struct
  type t = float
  let zero = 0.
  let one = 1.
  let add = ( +. )
  let sub = ( -. )
  let mul = ( *. )
  let div = ( /. )
  let of_int = float_of_int
  let is_zero x = Float.abs x < 1e-300
end

module Mod_prime (P : sig val p : int end) : S with type t = int = struct
  type t = int
  let p = P.p
  let zero = 0
  let one = 1
  let norm x = let r = x mod p in if r < 0 then r + p else r
  let add a b = let s = a + b in if s >= p then s - p else s
  let sub a b = let s = a - b in if s < 0 then s + p else s
  let mul a b = a * b mod p
  let rec pow a e = if e = 0 then 1 else let h = pow (mul a a) (e / 2) in if e land 1 = 1 then mul a h else h
  let div a b = mul a (pow b (p - 2))
  let of_int = norm
  let is_zero x = x = 0
end
