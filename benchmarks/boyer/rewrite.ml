(* Innermost rewriting with one-way matching, and a tautology checker for terms built
   from (if test then else) over atoms, with the constants t and f. *)

open Term

let rewrites = ref 0

let add_rule text =
  match parse text with
  | App (eq, [ (App (f, _) as lhs); rhs ]) when eq.name = "rule" -> f.rules <- f.rules @ [ (lhs, rhs) ]
  | _ -> invalid_arg ("add_rule: " ^ text)

exception No_match

(* extends [subst] so that pattern [p] instantiated by it equals [t] *)
let rec matches subst p t =
  match p with
  | Var v ->
    (match List.assoc_opt v subst with
     | Some bound -> if equal bound t then subst else raise No_match
     | None -> (v, t) :: subst)
  | App (f, ps) ->
    (match t with
     | App (g, ts) when f == g -> List.fold_left2 matches subst ps ts
     | _ -> raise No_match)

let rec instantiate subst = function
  | Var v -> List.assoc v subst
  | App (f, args) -> App (f, List.map (instantiate subst) args)

let rec rewrite t =
  match t with
  | Var _ -> t
  | App (f, args) -> apply_rules (App (f, List.map rewrite args)) f.rules

and apply_rules t = function
  | [] -> t
  | (lhs, rhs) :: rest ->
    (match matches [] lhs t with
     | subst ->
       incr rewrites;
       rewrite (instantiate subst rhs)
     | exception No_match -> apply_rules t rest)

let truth = intern "t"
let falsity = intern "f"
let if_sym = intern "if"

let is_const s = function App (g, []) -> g == s | _ -> false
let known lst x = List.exists (equal x) lst

(* decides whether [x] is true under every assignment of its atoms consistent with
   the atoms assumed true ([yes]) and false ([no]) *)
let rec tautology yes no x =
  if is_const truth x || known yes x then true
  else if is_const falsity x || known no x then false
  else
    match x with
    | App (g, [ test; th; el ]) when g == if_sym ->
      if known yes test then tautology yes no th
      else if known no test then tautology yes no el
      else tautology (test :: yes) no th && tautology yes (test :: no) el
    | _ -> false

let prove t = tautology [] [] (rewrite t)
