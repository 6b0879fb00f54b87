(* Enumeration of all permutations of 0..n-1 in the rotation order of fannkuch-redux:
   the counter at level i says how many more left-rotations of the prefix of length
   i+1 remain before the next level advances. *)

module type SINK = sig
  type t
  val empty : t
  val visit : t -> index:int -> int array -> t
end

module Fold (S : SINK) = struct
  (* visits the first [limit] permutations (all of them when limit <= 0) *)
  let run ?(limit = 0) n =
    let p = Array.init n (fun i -> i) in
    let count = Array.init n (fun i -> i) in
    let acc = ref S.empty and index = ref 0 in
    let rec advance i =
      if i >= n then false
      else begin
        Perm.rotate_prefix p i;
        if count.(i) > 0 then begin
          count.(i) <- count.(i) - 1;
          true
        end
        else begin
          count.(i) <- i;
          advance (i + 1)
        end
      end
    in
    let continue = ref true in
    while !continue do
      acc := S.visit !acc ~index:!index p;
      incr index;
      continue := (limit <= 0 || !index < limit) && advance 1
    done;
    (!acc, !index)
end
