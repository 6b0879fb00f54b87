(* First-order terms with integer-coded symbols, substitutions, matching and
   unification. Substitutions are association lists passed around as values. *)

type t = Var of int | App of int * t list

let rec size = function Var _ -> 1 | App (_, args) -> List.fold_left (fun s a -> s + size a) 1 args

let rec max_var = function
  | Var v -> v
  | App (_, args) -> List.fold_left (fun m a -> max m (max_var a)) (-1) args

let rec occurs v = function Var w -> v = w | App (_, args) -> List.exists (occurs v) args

let rec map_vars f = function Var v -> f v | App (s, args) -> App (s, List.map (map_vars f) args)

let shift k t = map_vars (fun v -> Var (v + k)) t

type subst = (int * t) list

(* one-step instantiation (for matching substitutions) *)
let instantiate (s : subst) t = map_vars (fun v -> match List.assoc_opt v s with Some u -> u | None -> Var v) t

(* full application of a triangular substitution (for unifiers) *)
let rec resolve (s : subst) t =
  match t with
  | Var v -> ( match List.assoc_opt v s with Some u -> resolve s u | None -> t)
  | App (f, args) -> App (f, List.map (resolve s) args)

let rec walk s t = match t with Var v -> ( match List.assoc_opt v s with Some u -> walk s u | None -> t) | _ -> t

let matches pat t =
  let rec go s pat t =
    match (pat, t) with
    | Var v, _ -> (
        match List.assoc_opt v s with Some u -> if u = t then Some s else None | None -> Some ((v, t) :: s))
    | App (f, ps), App (g, ts) when f = g -> go_list s ps ts
    | App _, _ -> None
  and go_list s ps ts =
    match (ps, ts) with
    | [], [] -> Some s
    | p :: ps, t :: ts -> ( match go s p t with Some s -> go_list s ps ts | None -> None)
    | _ -> None
  in
  go [] pat t

let unify a b =
  let rec go s a b =
    match (walk s a, walk s b) with
    | Var x, Var y when x = y -> Some s
    | Var x, t | t, Var x -> if occurs x (resolve s t) then None else Some ((x, t) :: s)
    | App (f, xs), App (g, ys) -> if f <> g then None else go_list s xs ys
  and go_list s xs ys =
    match (xs, ys) with
    | [], [] -> Some s
    | x :: xs, y :: ys -> ( match go s x y with Some s -> go_list s xs ys | None -> None)
    | _ -> None
  in
  go [] a b

(* every non-variable subterm with a function rebuilding the whole term around a
   replacement for it *)
let positions t =
  let rec go t ctx acc =
    match t with
    | Var _ -> acc
    | App (f, args) ->
        let acc = (t, ctx) :: acc in
        let rec loop before after acc =
          match after with
          | [] -> acc
          | a :: rest ->
              let acc = go a (fun u -> ctx (App (f, List.rev_append before (u :: rest)))) acc in
              loop (a :: before) rest acc
        in
        loop [] args acc
  in
  List.rev (go t (fun u -> u) [])

(* variables renumbered 0, 1, ... in order of first occurrence (in both terms) *)
let canonical_pair (l, r) =
  let tbl = ref [] in
  let f v =
    match List.assoc_opt v !tbl with
    | Some w -> Var w
    | None ->
        let w = List.length !tbl in
        tbl := (v, w) :: !tbl;
        Var w
  in
  let l = map_vars f l in
  let r = map_vars f r in
  (l, r)

let to_string names t =
  let var v = if v < 6 then String.make 1 "xyzuvw".[v] else "x" ^ string_of_int v in
  let rec go b = function
    | Var v -> Buffer.add_string b (var v)
    | App (f, []) -> Buffer.add_string b (names f)
    | App (f, [ x; y ]) when names f = "*" ->
        Buffer.add_char b '(';
        go b x;
        Buffer.add_string b " * ";
        go b y;
        Buffer.add_char b ')'
    | App (f, args) ->
        Buffer.add_string b (names f);
        Buffer.add_char b '(';
        List.iteri (fun i a -> if i > 0 then Buffer.add_string b ", "; go b a) args;
        Buffer.add_char b ')'
  in
  let b = Buffer.create 32 in
  go b t;
  Buffer.contents b
