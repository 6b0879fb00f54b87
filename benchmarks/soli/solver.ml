(* Depth-first search for a jump sequence leaving one peg on the target cell. A found
   solution escapes the recursion as an exception; positions known to fail are kept in
   a hash table. *)

exception Solved of (int * int * int) list

module Seen = Hashtbl.Make (struct
  type t = int
  let equal (a : int) b = a = b
  let hash p = (p * 0x9E3779B1) lxor (p lsr 29) land max_int
end)

type stats = { mutable visited : int; mutable pruned : int }

let solve (b : Board.t) ~start ~target =
  let dead = Seen.create 65536 in
  let st = { visited = 0; pruned = 0 } in
  let goal = Board.bit target in
  let rec search pos path =
    st.visited <- st.visited + 1;
    if pos = goal then raise (Solved (List.rev path));
    if Seen.mem dead pos then st.pruned <- st.pruned + 1
    else begin
      Array.iter (fun m -> if Board.can_jump pos m then search (Board.jump pos m) (m :: path)) b.moves;
      Seen.add dead pos ()
    end
  in
  match search start [] with
  | () -> (None, st)
  | exception Solved path -> (Some path, st)
