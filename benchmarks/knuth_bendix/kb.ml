(* Knuth-Bendix completion with a lexicographic path ordering. Rewriting, critical
   pairs and the ordering are all parameterised by closures. *)

open Term

(* lexicographic path ordering for a precedence on symbols *)
let lpo_gt prec =
  let rec gt s t =
    match (s, t) with
    | Var _, _ -> false
    | App _, Var x -> occurs x s
    | App (f, ss), App (g, ts) ->
        List.exists (fun si -> si = t || gt si t) ss
        || List.for_all (fun ti -> gt s ti) ts
           && (prec f > prec g || (f = g && lex ss ts))
  and lex ss ts =
    match (ss, ts) with
    | s1 :: ss', t1 :: ts' -> if s1 = t1 then lex ss' ts' else gt s1 t1
    | _ -> false
  in
  gt

type rule = Term.t * Term.t

let rec rewrite_root rules t =
  match rules with
  | [] -> None
  | (l, r) :: rest -> (
      match matches l t with Some s -> Some (instantiate s r) | None -> rewrite_root rest t)

let rec normalize rules t =
  match t with
  | Var _ -> t
  | App (f, args) -> (
      let t' = App (f, List.map (normalize rules) args) in
      match rewrite_root rules t' with Some u -> normalize rules u | None -> t')

let reducible_by (l, _) t = List.exists (fun (sub, _) -> matches l sub <> None) (positions t)

(* critical pairs from overlapping (l2, r2) into non-variable positions of l1 *)
let critical_pairs ((l1, r1) : rule) ((l2, r2) : rule) ~same =
  let k = max_var l1 + 1 in
  let l2 = shift k l2 and r2 = shift k r2 in
  List.filter_map
    (fun (sub, ctx) ->
      if same && sub == l1 then None
      else
        match unify sub l2 with
        | None -> None
        | Some s -> Some (resolve s r1, resolve s (ctx r2)))
    (positions l1)

exception Failed of string

let complete ?(max_steps = 10_000) gt equations =
  let rules = ref [] in
  let pending = ref equations in
  let steps = ref 0 in
  let pick () =
    (* smallest equation first; ties keep queue order *)
    let weight (s, t) = size s + size t in
    let best =
      List.fold_left (fun best e -> match best with Some b when weight b <= weight e -> best | _ -> Some e) None !pending
    in
    match best with
    | None -> None
    | Some e ->
        let rec remove = function [] -> [] | x :: xs -> if x == e then xs else x :: remove xs in
        pending := remove !pending;
        Some e
  in
  let rec loop () =
    match pick () with
    | None -> ()
    | Some (s, t) ->
        incr steps;
        if !steps > max_steps then raise (Failed "too many steps");
        let s = normalize !rules s and t = normalize !rules t in
        if s <> t then begin
          let rule =
            if gt s t then canonical_pair (s, t)
            else if gt t s then canonical_pair (t, s)
            else raise (Failed "cannot orient an equation")
          in
          let keep, back = List.partition (fun (l, _) -> not (reducible_by rule l)) !rules in
          let current = keep @ [ rule ] in
          rules := List.map (fun (l, r) -> (l, normalize current r)) keep @ [ rule ];
          pending := !pending @ back;
          let cps =
            List.concat_map
              (fun other ->
                if other == rule then critical_pairs rule rule ~same:true
                else critical_pairs rule other ~same:false @ critical_pairs other rule ~same:false)
              !rules
          in
          pending := !pending @ cps
        end;
        loop ()
  in
  loop ();
  (!rules, !steps)
