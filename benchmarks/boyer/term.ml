(* Terms over interned function symbols; each symbol carries the rewrite rules whose
   left-hand side it heads. Pattern variables are written ?x in the concrete syntax. *)

type sym = { name : string; id : int; mutable rules : (term * term) list }
and term = Var of string | App of sym * term list

let table : (string, sym) Hashtbl.t = Hashtbl.create 64

let intern name =
  match Hashtbl.find_opt table name with
  | Some s -> s
  | None ->
    let s = { name; id = Hashtbl.length table; rules = [] } in
    Hashtbl.add table name s;
    s

let app name args = App (intern name, args)
let const name = App (intern name, [])

let rec equal a b =
  match (a, b) with
  | Var x, Var y -> String.equal x y
  | App (f, xs), App (g, ys) -> f == g && List.equal equal xs ys
  | _ -> false

let rec size = function Var _ -> 1 | App (_, args) -> List.fold_left (fun n t -> n + size t) 1 args

(* ---- s-expression reader ---- *)

exception Syntax of string

let parse s =
  let n = String.length s and pos = ref 0 in
  let rec skip () = if !pos < n && (s.[!pos] = ' ' || s.[!pos] = '\n') then (incr pos; skip ()) in
  let is_word c = c <> ' ' && c <> '\n' && c <> '(' && c <> ')' in
  let word () =
    let start = !pos in
    while !pos < n && is_word s.[!pos] do incr pos done;
    String.sub s start (!pos - start)
  in
  let rec term () =
    skip ();
    if !pos >= n then raise (Syntax "unexpected end");
    match s.[!pos] with
    | '(' ->
      incr pos;
      skip ();
      let head = word () in
      let rec args acc =
        skip ();
        if !pos < n && s.[!pos] = ')' then (incr pos; List.rev acc) else args (term () :: acc)
      in
      app head (args [])
    | ')' -> raise (Syntax "unexpected )")
    | _ ->
      let w = word () in
      if String.length w > 1 && w.[0] = '?' then Var (String.sub w 1 (String.length w - 1)) else const w
  in
  let t = term () in
  skip ();
  if !pos <> n then raise (Syntax "trailing text");
  t

let rec print buf = function
  | Var x -> Buffer.add_char buf '?'; Buffer.add_string buf x
  | App (f, []) -> Buffer.add_string buf f.name
  | App (f, args) ->
    Buffer.add_char buf '(';
    Buffer.add_string buf f.name;
    List.iter (fun a -> Buffer.add_char buf ' '; print buf a) args;
    Buffer.add_char buf ')'

let to_string t = let b = Buffer.create 64 in print b t; Buffer.contents b
