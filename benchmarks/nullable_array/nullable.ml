(* Arrays whose slots may be empty, behind one signature, in two representations:
   an array of options, and a flat array in which one reserved value (compared
   physically) marks an empty slot. *)

module type S = sig
  type elt
  type t
  val make : int -> t
  val length : t -> int
  val is_null : t -> int -> bool
  val get : t -> int -> elt option
  val get_or : t -> int -> default:elt -> elt
  val set : t -> int -> elt -> unit
  val clear : t -> int -> unit
  val fold : ('a -> int -> elt -> 'a) -> 'a -> t -> 'a
end

module Boxed (E : sig type t end) : S with type elt = E.t = struct
  type elt = E.t
  type t = elt option array
  let make n = Array.make n None
  let length = Array.length
  let is_null a i = match a.(i) with None -> true | Some _ -> false
  let get a i = a.(i)
  let get_or a i ~default = match a.(i) with None -> default | Some x -> x
  let set a i x = a.(i) <- Some x
  let clear a i = a.(i) <- None
  let fold f acc a =
    let r = ref acc in
    Array.iteri (fun i -> function None -> () | Some x -> r := f !r i x) a;
    !r
end

(* [sentinel] must be a value no caller stores, recognised by [is_sentinel] (physical
   equality for boxed values, a NaN test for floats, which float arrays keep unboxed) *)
module Flat (E : sig type t val sentinel : t val is_sentinel : t -> bool end) : S with type elt = E.t = struct
  type elt = E.t
  type t = elt array
  let make n = Array.make n E.sentinel
  let length = Array.length
  let is_null a i = E.is_sentinel a.(i)
  let get a i = let x = a.(i) in if E.is_sentinel x then None else Some x
  let get_or a i ~default = let x = a.(i) in if E.is_sentinel x then default else x
  let set a i x = a.(i) <- x
  let clear a i = a.(i) <- E.sentinel
  let fold f acc a =
    let r = ref acc in
    for i = 0 to Array.length a - 1 do
      let x = a.(i) in
      if not (E.is_sentinel x) then r := f !r i x
    done;
    !r
end
