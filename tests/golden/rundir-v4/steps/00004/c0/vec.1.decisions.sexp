(inlining_decisions
 (version 1)
 (unit "Vec")
 (round 1)
 (overrides (entries 6) (matched 6) (unmatched 0)
  (unmatched_keys ()))
 (decisions
  ((key "D(Vec.fold@vec.ml:4:9-99)/D(Vec.go@vec.ml:5:13-64)/C(Vec.go@vec.ml:5:44-64)") (callee "Vec.go") (action dont_inline) (reason (prevented self_call)) (override dont_inline))
  ((key "D(Vec.fold@vec.ml:4:9-99)/C(Vec.go@vec.ml:6:2-11)") (callee "Vec.go") (action dont_inline) (reason override) (override dont_inline))
  ((key "D(Vec.sum_squares@vec.ml:7:16-62)/C(Vec.fold@vec.ml:7:20-62)") (callee "Vec.fold") (action inline) (reason override) (override inline))
  ((key "D(Vec.sum_squares@vec.ml:7:16-62)/C(Vec.fold@vec.ml:7:20-62)/I/D(Vec.go@vec.ml:5:13-64)/C(Vec.anon_fn[vec.ml:7,25--58]@vec.ml:5:47-56)") (callee "Vec.anon_fn[vec.ml:7,25--58]") (action inline) (reason override) (override inline))
  ((key "D(Vec.sum_squares@vec.ml:7:16-62)/C(Vec.fold@vec.ml:7:20-62)/I/D(Vec.go@vec.ml:5:13-64)/C(Vec.go@vec.ml:5:44-64)") (callee "Vec.go") (action dont_inline) (reason (prevented self_call)) (override dont_inline))
  ((key "D(Vec.sum_squares@vec.ml:7:16-62)/C(Vec.fold@vec.ml:7:20-62)/I/C(Vec.go@vec.ml:6:2-11)") (callee "Vec.go") (action dont_inline) (reason override) (override dont_inline))
 ))
