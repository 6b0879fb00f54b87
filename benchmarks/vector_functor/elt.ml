(* Element modules for the vector functor: a small ring signature and four instances. *)

module type S = sig
  type t
  val name : string
  val zero : t
  val one : t
  val of_int : int -> t
  val add : t -> t -> t
  val sub : t -> t -> t
  val mul : t -> t -> t
  (* a machine-independent summary of a value *)
  val digest : t -> string
  (* a size, for tolerance checks *)
  val magnitude : t -> float
end

(* values below 1e-9 in magnitude are rounding noise from cancellations: shown as 0 *)
let show x = Printf.sprintf "%.6e" (if Float.abs x < 1e-9 then 0. else x)

module F64 : S with type t = float = struct
  type t = float
  let name = "float"
  let zero = 0.
  let one = 1.
  let of_int = float_of_int
  let add = ( +. )
  let sub = ( -. )
  let mul = ( *. )
  let digest = show
  let magnitude = Float.abs
end

(* arithmetic modulo a prime below 2^30, so products fit in an int *)
module Modp : S with type t = int = struct
  type t = int
  let p = 1_000_000_007
  let name = "mod-p"
  let zero = 0
  let one = 1
  let of_int n = let r = n mod p in if r < 0 then r + p else r
  let add a b = let s = a + b in if s >= p then s - p else s
  let sub a b = let s = a - b in if s < 0 then s + p else s
  let mul a b = a * b mod p
  let digest = string_of_int
  let magnitude = float_of_int
end

(* dual numbers: value and derivative, for forward-mode differentiation *)
module Dual : S with type t = float * float = struct
  type t = float * float
  let name = "dual"
  let zero = (0., 0.)
  let one = (1., 0.)
  let of_int n = (float n, 0.)
  let add (a, da) (b, db) = (a +. b, da +. db)
  let sub (a, da) (b, db) = (a -. b, da -. db)
  let mul (a, da) (b, db) = (a *. b, (a *. db) +. (da *. b))
  let digest (a, d) = show a ^ "/" ^ show d
  let magnitude (a, d) = Float.abs a +. Float.abs d
end

module Cplx : S with type t = Complex.t = struct
  type t = Complex.t
  let name = "complex"
  let zero = Complex.zero
  let one = Complex.one
  let of_int n = { Complex.re = float n; im = 0. }
  let add = Complex.add
  let sub = Complex.sub
  let mul = Complex.mul
  let digest { Complex.re; im } = show re ^ " " ^ show im ^ "i"
  let magnitude = Complex.norm
end
