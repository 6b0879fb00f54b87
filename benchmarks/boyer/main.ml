(* Boyer-style prover: rewrites generated implication chains over lists and numbers
   with a rule base, then checks the results are tautologies. Arguments: list depth,
   chain length, repetitions. *)

let rules =
  [ "(rule (and ?p ?q) (if ?p (if ?q t f) f))";
    "(rule (or ?p ?q) (if ?p t (if ?q t f)))";
    "(rule (not ?p) (if ?p f t))";
    "(rule (implies ?p ?q) (if ?p (if ?q t f) t))";
    "(rule (if (if ?a ?b ?c) ?d ?e) (if ?a (if ?b ?d ?e) (if ?c ?d ?e)))";
    "(rule (if t ?x ?y) ?x)";
    "(rule (if f ?x ?y) ?y)";
    "(rule (append (append ?x ?y) ?z) (append ?x (append ?y ?z)))";
    "(rule (append (nil) ?y) ?y)";
    "(rule (reverse (append ?x ?y)) (append (reverse ?y) (reverse ?x)))";
    "(rule (reverse (cons ?x ?y)) (append (reverse ?y) (cons ?x (nil))))";
    "(rule (reverse (nil)) (nil))";
    "(rule (length (append ?x ?y)) (plus (length ?x) (length ?y)))";
    "(rule (length (reverse ?x)) (length ?x))";
    "(rule (length (cons ?x ?y)) (add1 (length ?y)))";
    "(rule (length (nil)) (zero))";
    "(rule (member ?x (append ?a ?b)) (or (member ?x ?a) (member ?x ?b)))";
    "(rule (member ?x (reverse ?y)) (member ?x ?y))";
    "(rule (member ?x (cons ?y ?z)) (or (equal ?x ?y) (member ?x ?z)))";
    "(rule (member ?x (nil)) f)";
    "(rule (plus (plus ?x ?y) ?z) (plus ?x (plus ?y ?z)))";
    "(rule (plus (zero) ?x) (fix ?x))";
    "(rule (plus (add1 ?x) ?y) (add1 (plus ?x ?y)))";
    "(rule (times ?x (plus ?y ?z)) (plus (times ?x ?y) (times ?x ?z)))";
    "(rule (times (times ?x ?y) ?z) (times ?x (times ?y ?z)))";
    "(rule (lessp (plus ?x ?y) (plus ?x ?z)) (lessp ?y ?z))";
    "(rule (lessp (add1 ?x) (add1 ?y)) (lessp ?x ?y))";
    "(rule (equal ?x ?x) t)";
    "(rule (equal (plus ?x ?y) (plus ?x ?z)) (equal (fix ?y) (fix ?z)))";
    "(rule (greatereqp ?x ?y) (not (lessp ?x ?y)))";
    "(rule (lesseqp ?x ?y) (not (lessp ?y ?x)))";
    "(rule (difference ?x ?x) (zero))" ]

(* a left-nested append of [d] atoms named after [j] *)
let list_term buf j d =
  for _ = 2 to d do Buffer.add_string buf "(append " done;
  Printf.bprintf buf "x%d_1" j;
  for k = 2 to d do Printf.bprintf buf " (cons y%d_%d x%d_%d))" j k j k done

let prop buf ~seed j d =
  let l () = list_term buf j d in
  Printf.bprintf buf "(and (member e%d (reverse (append " (seed mod 3);
  l ();
  Printf.bprintf buf " (cons a%d (nil))))) (lessp (plus (plus (length " j;
  l ();
  Printf.bprintf buf ") n%d) z) (plus (times (length (reverse " j;
  l ();
  Printf.bprintf buf ")) (plus u%d v)) (plus n%d w))))" seed j

(* (implies (and (implies p1 p2) ... (implies p(k-1) pk)) (implies p1 pk)), or with the
   conclusion reversed, which is not a tautology *)
let chain ~seed ~d ~k ~valid =
  let buf = Buffer.create 1024 in
  let p j = prop buf ~seed j d in
  Buffer.add_string buf "(implies ";
  for j = 1 to k - 1 do
    if j < k - 1 then Buffer.add_string buf "(and ";
    Buffer.add_string buf "(implies ";
    p j;
    Buffer.add_char buf ' ';
    p (j + 1);
    Buffer.add_string buf ") "
  done;
  for _ = 1 to k - 2 do Buffer.add_char buf ')' done;
  Buffer.add_string buf " (implies ";
  if valid then (p 1; Buffer.add_char buf ' '; p k) else (p k; Buffer.add_char buf ' '; p 1);
  Buffer.add_string buf "))";
  Buffer.contents buf

let () =
  let d = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 3 in
  let k = if Array.length Sys.argv > 2 then int_of_string Sys.argv.(2) else 3 in
  let reps = if Array.length Sys.argv > 3 then int_of_string Sys.argv.(3) else 1 in
  List.iter Rewrite.add_rule rules;
  let proved = ref 0 and refuted = ref 0 and size = ref 0 and text = ref 0 in
  for seed = 1 to reps do
    List.iter
      (fun valid ->
        let s = chain ~seed ~d ~k ~valid in
        text := !text + String.length s;
        let t = Term.parse s in
        let nf = Rewrite.rewrite t in
        size := !size + Term.size nf;
        if Rewrite.tautology [] [] nf then incr proved else incr refuted)
      [ true; false ]
  done;
  Printf.printf "depth %d chain %d reps %d\n" d k reps;
  Printf.printf "proved %d refuted %d\n" !proved !refuted;
  Printf.printf "input chars %d, normal-form nodes %d, rewrites %d\n" !text !size !Rewrite.rewrites;
  let small = Term.parse (chain ~seed:0 ~d:1 ~k:2 ~valid:true) in
  Printf.printf "smallest instance rewrites to a term of size %d\n" (Term.size (Rewrite.rewrite small))
