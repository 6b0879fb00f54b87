(* Completes two presentations of group theory (left and right identity/inverse
   axioms) [reps] times and prints the resulting canonical rewrite systems' summary. *)

open Term

let e = App (0, [])
let ( *: ) a b = App (1, [ a; b ])
let i a = App (2, [ a ])
let x = Var 0 and y = Var 1 and z = Var 2
let names = function 0 -> "e" | 1 -> "*" | 2 -> "i" | _ -> "?"
let prec f = f (* i > * > e *)

let left = [ (e *: x, x); (i x *: x, e); ((x *: y) *: z, x *: (y *: z)) ]
let right = [ (x *: e, x); (x *: i x, e); ((x *: y) *: z, x *: (y *: z)) ]

let fnv s =
  let h = ref 0x0bf29ce484222325 in
  String.iter (fun c -> h := (!h lxor Char.code c) * 0x100000001b3) s;
  !h land 0xffffffff

let show rules =
  rules
  |> List.map (fun (l, r) -> to_string names l ^ " -> " ^ to_string names r)
  |> List.sort compare

let () =
  let reps = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 1 in
  let gt = Kb.lpo_gt prec in
  let result = ref [] in
  for _ = 1 to reps do
    result :=
      List.map
        (fun eqs -> match Kb.complete gt eqs with rules, steps -> (show rules, steps) | exception Kb.Failed m -> ([ m ], 0))
        [ left; right ]
  done;
  List.iter2
    (fun name (rules, steps) ->
      Printf.printf "%s: %d rules after %d steps, hash %08x\n" name (List.length rules) steps
        (fnv (String.concat "\n" rules)))
    [ "left axioms"; "right axioms" ] !result;
  (match !result with
  | [ (a, _); (b, _) ] ->
      Printf.printf "same system: %b\n" (a = b);
      List.iter print_endline a
  | _ -> ());
  Printf.printf "reps %d\n" reps
