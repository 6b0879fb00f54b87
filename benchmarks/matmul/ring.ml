(* Element rings for the matrix product. *)

module type S = sig
  type t
  val zero : t
  val add : t -> t -> t
  val mul : t -> t -> t
  val of_int : int -> t
  val checksum : t -> int  (* a machine-independent digest of a value *)
end

module Float_ring : S with type t = float = struct
  type t = float
  let zero = 0.
  let add = ( +. )
  let mul = ( *. )
  let of_int i = float_of_int (i land 1023) /. 128.
  let checksum x = Int64.to_int (Int64.rem (Int64.bits_of_float x) 1_000_000_007L)
end

(* integers modulo 2^32 *)
module Word_ring : S with type t = int = struct
  type t = int
  let zero = 0
  let add a b = (a + b) land 0xffffffff
  let mul a b = (a * b) land 0xffffffff
  let of_int i = i land 0xffffffff
  let checksum x = x
end

(* the tropical (min, +) semiring: "zero" is infinity *)
module Tropical : S with type t = int = struct
  type t = int
  let zero = max_int
  let add (a : int) b = if a < b then a else b
  let mul a b = if a = max_int || b = max_int then max_int else a + b
  let of_int i = i land 0xfff
  let checksum x = x
end
