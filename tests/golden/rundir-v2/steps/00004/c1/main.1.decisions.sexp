(inlining_decisions
 (version 1)
 (unit "Main")
 (round 1)
 (overrides (entries 2) (matched 2) (unmatched 0)
  (unmatched_keys ()))
 (decisions
  ((key "C(Vec.sum_squares@main.ml:4:33-56)") (callee "Vec.sum_squares") (action dont_inline) (reason override) (override dont_inline))
  ((key "C(Stdlib__Printf.printf@main.ml:5:2-36)") (callee "Stdlib__Printf.printf") (action dont_inline) (reason override) (override dont_inline))
 ))
