(* Reduced ordered binary decision diagrams with hash-consing: every node is built
   through [mk], which looks it up in a unique table, so equal functions are physically
   equal nodes. Binary operations are memoised on node identities. *)

type t = False | True | Node of node
and node = { id : int; var : int; low : t; high : t }

let id = function False -> 0 | True -> 1 | Node n -> n.id

module Key = struct
  type t = int * int * int
  let equal ((a, b, c) : t) (x, y, z) = a = x && b = y && c = z
  let hash (a, b, c) = ((a * 7919) + (b * 104729) + (c * 1299709)) land max_int
end

module Unique = Hashtbl.Make (Key)

let unique : t Unique.t = Unique.create 4096
let next_id = ref 2
let memo : t Unique.t = Unique.create 4096

let reset () =
  Unique.reset unique;
  Unique.reset memo;
  next_id := 2

let node_count () = Unique.length unique

let mk var low high =
  if id low = id high then low
  else
    let key = (var, id low, id high) in
    match Unique.find_opt unique key with
    | Some n -> n
    | None ->
        let n = Node { id = !next_id; var; low; high } in
        incr next_id;
        Unique.add unique key n;
        n

let var i = mk i False True
let nvar i = mk i True False
let top_var = function Node n -> n.var | _ -> max_int

let of_bool b = if b then True else False

(* generic binary apply: [tag] distinguishes operators in the shared memo table *)
let apply tag (op : bool -> bool -> bool) =
  let rec go a b =
    match (a, b) with
    | (False | True), (False | True) -> of_bool (op (a = True) (b = True))
    | _ ->
        let key = (tag, id a, id b) in
        (match Unique.find_opt memo key with
         | Some r -> r
         | None ->
             let v = min (top_var a) (top_var b) in
             let cof x hi = match x with Node n when n.var = v -> if hi then n.high else n.low | _ -> x in
             let r = mk v (go (cof a false) (cof b false)) (go (cof a true) (cof b true)) in
             Unique.add memo key r;
             r)
  in
  go

let conj = apply (-1) ( && )
let disj = apply (-2) ( || )
let xor = apply (-3) ( <> )
let iff = apply (-4) ( = )
let imp = apply (-5) (fun a b -> (not a) || b)
let neg a = xor a True

let conj_list l = List.fold_left conj True l
let disj_list l = List.fold_left disj False l

(* number of satisfying assignments over variables 0 .. nvars-1 *)
let sat_count nvars t =
  let tbl = Hashtbl.create 1024 in
  let level = function Node n -> n.var | _ -> nvars in
  let rec count t =
    match t with
    | False -> 0
    | True -> 1
    | Node n -> (
        match Hashtbl.find_opt tbl n.id with
        | Some c -> c
        | None ->
            let side c = count c lsl (level c - n.var - 1) in
            let c = side n.low + side n.high in
            Hashtbl.add tbl n.id c;
            c)
  in
  count t lsl level t
