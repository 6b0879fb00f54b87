(* The list version: numbers are list lengths, compared without computing lengths. *)

let rec listn n = if n = 0 then [] else n :: listn (n - 1)

(* is x shorter than y? *)
let rec shorter x y = match (x, y) with _, [] -> false | [], _ -> true | _ :: x', _ :: y' -> shorter x' y'

let tail = function [] -> invalid_arg "Takl.tail" | _ :: t -> t

let rec mas x y z = if not (shorter y x) then z else mas (mas (tail x) y z) (mas (tail y) z x) (mas (tail z) x y)

let takl x y z = List.length (mas (listn x) (listn y) (listn z))
