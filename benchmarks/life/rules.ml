(* Life-like rules as modules (birth and survival neighbour counts), and a functor that
   runs a board under one of them. *)

module type RULE = sig
  val name : string
  val born : int list
  val survives : int list
end

module Conway = struct let name = "B3/S23 (life)" let born = [ 3 ] let survives = [ 2; 3 ] end
module Highlife = struct let name = "B36/S23 (highlife)" let born = [ 3; 6 ] let survives = [ 2; 3 ] end
module Day_night = struct let name = "B3678/S34678 (day & night)" let born = [ 3; 6; 7; 8 ] let survives = [ 3; 4; 6; 7; 8 ] end
module Maze = struct let name = "B3/S12345 (maze)" let born = [ 3 ] let survives = [ 1; 2; 3; 4; 5 ] end

module Run (R : RULE) = struct
  (* the rule as a 2 x 9 truth table, looked up by a small closure *)
  let table = Array.init 18 (fun k -> List.mem (k mod 9) (if k < 9 then R.born else R.survives))
  let rule alive n = table.((if alive then 9 else 0) + n)

  let evolve board generations =
    let a = ref (Board.copy board) and b = ref (Board.create board.Board.w board.Board.h) in
    let history = ref [] in
    for g = 1 to generations do
      Board.step rule !a !b;
      let t = !a in
      a := !b;
      b := t;
      if g mod 10 = 0 then history := Board.population !a :: !history
    done;
    (!a, List.rev !history)
end
