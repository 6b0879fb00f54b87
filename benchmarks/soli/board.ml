(* Peg-solitaire boards on a 7x7 grid: a position is an int with one bit per cell
   (bit 7*row + col set when the cell holds a peg). *)

type t = { name : string; cells : int list; moves : (int * int * int) array }

let bit i = 1 lsl i
let has pos i = pos land bit i <> 0
let pegs pos = let rec go p n = if p = 0 then n else go (p land (p - 1)) (n + 1) in go pos 0

let inside shape r c = r >= 0 && r < 7 && c >= 0 && c < 7 && shape.[(r * 7) + c] = 'o'

let make name shape =
  let cells = List.filter (fun i -> shape.[i] = 'o') (List.init 49 (fun i -> i)) in
  let moves = ref [] in
  List.iter
    (fun i ->
      let r = i / 7 and c = i mod 7 in
      List.iter
        (fun (dr, dc) ->
          if inside shape (r + dr) (c + dc) && inside shape (r + (2 * dr)) (c + (2 * dc)) then
            moves := (i, i + (7 * dr) + dc, i + (14 * dr) + (2 * dc)) :: !moves)
        [ (-1, 0); (1, 0); (0, -1); (0, 1) ])
    cells;
  { name; cells; moves = Array.of_list (List.rev !moves) }

let english =
  make "english" ("..ooo.." ^ "..ooo.." ^ "ooooooo" ^ "ooooooo" ^ "ooooooo" ^ "..ooo.." ^ "..ooo..")

(* the same board with its move list rotated by [r]: another search order *)
let rotated b r =
  let n = Array.length b.moves in
  { b with moves = Array.init n (fun i -> b.moves.((i + r) mod n)) }

let full b = List.fold_left (fun p i -> p lor bit i) 0 b.cells

(* a jump from [a] over [b] into [c] *)
let can_jump pos (a, b, c) = has pos a && has pos b && not (has pos c)
let jump pos (a, b, c) = pos lxor (bit a lor bit b lor bit c)
