(inlining_decisions
 (version 1)
 (unit "Main")
 (round 0)
 (overrides (entries 4) (matched 4) (unmatched 0)
  (unmatched_keys ()))
 (decisions
  ((key "C(Vec.sum_squares@main.ml:4:33-56)") (callee "Vec.sum_squares") (action inline) (reason override) (override inline))
  ((key "C(Vec.sum_squares@main.ml:4:33-56)/I/D(Main.go@vec.ml:5:13-64)/C(Main.go@vec.ml:5:44-64)") (callee "Main.go") (action dont_inline) (reason (prevented self_call)) (override dont_inline))
  ((key "C(Vec.sum_squares@main.ml:4:33-56)/I/C(Main.go@vec.ml:7:20-62>vec.ml:6:2-11>vec.ml:5:44-64)") (callee "Main.go") (action dont_inline) (reason override) (override dont_inline))
  ((key "C(Stdlib__Printf.printf@main.ml:5:2-36)") (callee "Stdlib__Printf.printf") (action dont_inline) (reason override) (override dont_inline))
 ))
