(* Zero-suppressed decision diagrams, hash-consed: a node never has hi = Empty, and
   structurally equal nodes are physically equal, so ids identify families. *)

type t = Empty | Base | Node of { id : int; var : int; lo : t; hi : t }

let id = function Empty -> 0 | Base -> 1 | Node n -> n.id

module Key = struct
  type t = int * int * int
  let equal ((a, b, c) : t) (x, y, z) = a = x && b = y && c = z
  let hash (a, b, c) = (((a * 65599) + b) * 65599 + c) land max_int
end

module Unique = Hashtbl.Make (Key)

module Pair = struct
  type t = int * int
  let equal ((a, b) : t) (x, y) = a = x && b = y
  let hash (a, b) = ((a * 1000003) lxor b) land max_int
end

module Memo2 = Hashtbl.Make (Pair)
module Memo1 = Hashtbl.Make (struct type t = int let equal (a : int) b = a = b let hash x = x land max_int end)

let unique : t Unique.t = Unique.create 4096
let next_id = ref 2

let node var lo hi =
  match hi with
  | Empty -> lo
  | _ ->
    let k = (var, id lo, id hi) in
    (match Unique.find_opt unique k with
     | Some n -> n
     | None ->
       let n = Node { id = !next_id; var; lo; hi } in
       incr next_id;
       Unique.add unique k n;
       n)

let size () = Unique.length unique

let var_of = function Node n -> n.var | Empty | Base -> max_int

(* a binary operation memoised on the ids of its operands; [leaf] answers the
   cases that need no recursion *)
let binary leaf =
  let memo = Memo2.create 1024 in
  let rec op a b =
    match leaf a b with
    | Some r -> r
    | None ->
      let key = (id a, id b) in
      (match Memo2.find_opt memo key with
       | Some r -> r
       | None ->
         let r = step a b in
         Memo2.add memo key r;
         r)
  and step a b =
    match (a, b) with
    | Node x, Node y when x.var = y.var -> node x.var (op x.lo y.lo) (op x.hi y.hi)
    | Node x, _ when x.var < var_of b -> node x.var (op x.lo b) (op x.hi Empty)
    | _, Node y -> node y.var (op a y.lo) (op Empty y.hi)
    | _ -> assert false
  in
  (op, fun () -> Memo2.reset memo)

let union, reset_union =
  binary (fun a b ->
      match (a, b) with
      | Empty, x | x, Empty -> Some x
      | _ when a == b -> Some a
      | Node _, _ | _, Node _ -> None
      | _ -> Some Base)

(* intersection and difference need lopsided steps, so they get their own recursion *)
let inter_memo = Memo2.create 1024
let rec inter a b =
  match (a, b) with
  | Empty, _ | _, Empty -> Empty
  | _ when a == b -> a
  | Base, Node y -> inter Base y.lo
  | Node x, Base -> inter x.lo Base
  | Base, Base -> Base
  | Node x, Node y ->
    if x.var < y.var then inter x.lo b
    else if y.var < x.var then inter a y.lo
    else begin
      let key = (x.id, y.id) in
      match Memo2.find_opt inter_memo key with
      | Some r -> r
      | None ->
        let r = node x.var (inter x.lo y.lo) (inter x.hi y.hi) in
        Memo2.add inter_memo key r;
        r
    end

let diff_memo = Memo2.create 1024
let rec diff a b =
  match (a, b) with
  | Empty, _ -> Empty
  | _, Empty -> a
  | _ when a == b -> Empty
  | Base, Node y -> diff Base y.lo
  | Base, Base -> Empty
  | Node x, Base -> node x.var (diff x.lo Base) x.hi
  | Node x, Node y ->
    if y.var < x.var then diff a y.lo
    else begin
      let key = (x.id, y.id) in
      match Memo2.find_opt diff_memo key with
      | Some r -> r
      | None ->
        let r = if x.var < y.var then node x.var (diff x.lo b) x.hi else node x.var (diff x.lo y.lo) (diff x.hi y.hi) in
        Memo2.add diff_memo key r;
        r
    end

(* the sets of the family that contain [v] *)
let onset v z =
  let memo = Memo1.create 256 in
  let rec go = function
    | Empty | Base -> Empty
    | Node n ->
      if n.var = v then node v Empty n.hi
      else if n.var > v then Empty
      else
        match Memo1.find_opt memo n.id with
        | Some r -> r
        | None ->
          let r = node n.var (go n.lo) (go n.hi) in
          Memo1.add memo n.id r;
          r
  in
  go z

(* counts are taken modulo a prime, as big boards have more tilings than an int holds *)
let modulus = 1_000_000_007
let ( +% ) a b = let s = a + b in if s >= modulus then s - modulus else s

(* number of sets in the family, modulo [modulus] *)
let count_memo = Memo1.create 1024
let count =
  let memo = count_memo in
  let rec go = function
    | Empty -> 0
    | Base -> 1
    | Node n ->
      (match Memo1.find_opt memo n.id with
       | Some c -> c
       | None ->
         let c = go n.lo +% go n.hi in
         Memo1.add memo n.id c;
         c)
  in
  go

(* numbers of sets (modulo [modulus]) by how many of their elements satisfy [weighted]: result.(k) *)
let count_by ~max_k weighted z =
  let memo = Memo1.create 1024 in
  let rec go = function
    | Empty -> Array.make (max_k + 1) 0
    | Base -> Array.init (max_k + 1) (fun k -> if k = 0 then 1 else 0)
    | Node n ->
      (match Memo1.find_opt memo n.id with
       | Some a -> a
       | None ->
         let lo = go n.lo and hi = go n.hi in
         let shift = if weighted n.var then 1 else 0 in
         let a = Array.mapi (fun k l -> if k >= shift then l +% hi.(k - shift) else l) lo in
         Memo1.add memo n.id a;
         a)
  in
  go z

let reset () =
  Unique.reset unique;
  reset_union ();
  Memo2.reset inter_memo;
  Memo2.reset diff_memo;
  Memo1.reset count_memo
