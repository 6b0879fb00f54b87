(inlining_decisions
 (version 1)
 (unit "Vec")
 (round 0)
 (overrides (entries 5) (matched 5) (unmatched 0)
  (unmatched_keys ()))
 (decisions
  ((key "D(Vec.fold@vec.ml:4:9-99)/D(Vec.go@vec.ml:5:13-64)/C(Vec.go@vec.ml:5:44-64)") (callee "Vec.go") (action dont_inline) (reason (prevented self_call)) (override dont_inline))
  ((key "D(Vec.fold@vec.ml:4:9-99)/C(Vec.go@vec.ml:6:2-11)") (callee "Vec.go") (action dont_inline) (reason override) (override dont_inline))
  ((key "D(Vec.anon_fn[vec.ml:7,25--58]@vec.ml:7:25-58)/C(Vec.square@vec.ml:7:47-57)") (callee "Vec.square") (action inline) (reason override) (override inline))
  ((key "D(Vec.anon_fn[vec.ml:7,25--58]@vec.ml:7:25-58)/C(Vec.add@vec.ml:7:39-57)") (callee "Vec.add") (action inline) (reason override) (override inline))
  ((key "D(Vec.sum_squares@vec.ml:7:16-62)/C(Vec.fold@vec.ml:7:20-62)") (callee "Vec.fold") (action dont_inline) (reason override) (override dont_inline))
 ))
