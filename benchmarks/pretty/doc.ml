(* A small expression/statement language and a deterministic generator of its trees. *)

type expr =
  | Int of int
  | Var of string
  | Str of string
  | Binop of string * expr * expr
  | Call of string * expr list
  | Record of (string * expr) list
  | Fun of string list * stmt list

and stmt =
  | Let of string * expr
  | If of expr * stmt list * stmt list
  | While of expr * stmt list
  | Return of expr
  | Expr of expr

type gen = { mutable s : int }

let next g bound =
  g.s <- ((g.s * 2862933555777941757) + 3037000493) land max_int;
  (g.s lsr 20) mod bound

let names = [| "x"; "y"; "acc"; "total"; "index"; "buffer"; "count"; "left"; "right"; "node"; "value" |]
let funs = [| "f"; "map"; "fold_left"; "print"; "compute_checksum"; "lookup"; "insert"; "g" |]
let ops = [| "+"; "-"; "*"; "<"; "=="; "&&"; "||" |]
let pick g a = a.(next g (Array.length a))

let rec expr g depth =
  if depth <= 0 then (if next g 2 = 0 then Int (next g 1000) else Var (pick g names))
  else
    match next g 10 with
    | 0 | 1 -> Binop (pick g ops, expr g (depth - 1), expr g (depth - 1))
    | 2 | 3 | 4 -> Call (pick g funs, List.init (next g 4) (fun _ -> expr g (depth - 1)))
    | 5 -> Record (List.init (1 + next g 3) (fun _ -> (pick g names, expr g (depth - 2))))
    | 6 when depth > 2 -> Fun (List.init (next g 3) (fun _ -> pick g names), block g (depth - 2))
    | 7 -> Str (String.make (1 + next g 12) (Char.chr (97 + next g 26)))
    | _ -> expr g (depth - 2)

and stmt g depth =
  match next g 6 with
  | 0 | 1 -> Let (pick g names, expr g depth)
  | 2 when depth > 1 -> If (expr g (depth - 1), block g (depth - 1), if next g 2 = 0 then [] else block g (depth - 1))
  | 3 when depth > 1 -> While (expr g (depth - 1), block g (depth - 1))
  | 4 -> Return (expr g depth)
  | _ -> Expr (expr g depth)

and block g depth = List.init (1 + next g 4) (fun _ -> stmt g (depth - 1))

let program seed depth = block { s = seed } depth
