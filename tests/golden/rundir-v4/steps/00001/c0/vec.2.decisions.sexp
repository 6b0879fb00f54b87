(inlining_decisions
 (version 1)
 (unit "Vec")
 (round 2)
 (overrides (entries 8) (matched 6) (unmatched 2)
  (unmatched_keys ("D(Vec.sum_squares@vec.ml:7:16-62)/C(Vec.fold@vec.ml:7:20-62)/I/C(Vec.go@vec.ml:6:2-11)" "D(Vec.sum_squares@vec.ml:7:16-62)/C(Vec.fold@vec.ml:7:20-62)/I/D(Vec.go@vec.ml:5:13-64)/C(Vec.go@vec.ml:5:44-64)")))
 (decisions
  ((key "D(Vec.fold@vec.ml:4:9-99)/D(Vec.go@vec.ml:5:13-64)/C(Vec.go@vec.ml:5:44-64)") (callee "Vec.go") (action dont_inline) (reason (prevented self_call)) (override dont_inline))
  ((key "D(Vec.fold@vec.ml:4:9-99)/C(Vec.go@vec.ml:6:2-11)") (callee "Vec.go") (action inline) (reason override) (override inline))
  ((key "D(Vec.fold@vec.ml:4:9-99)/C(Vec.go@vec.ml:6:2-11)/I/C(Vec.go@vec.ml:5:44-64)") (callee "Vec.go") (action dont_inline) (reason (prevented unrolling_depth_exceeded)) (override dont_inline))
  ((key "D(Vec.sum_squares@vec.ml:7:16-62)/D(Vec.go@vec.ml:5:13-64)/C(Vec.go@vec.ml:5:44-64)") (callee "Vec.go") (action dont_inline) (reason (prevented self_call)) (override dont_inline))
  ((key "D(Vec.sum_squares@vec.ml:7:16-62)/C(Vec.go@vec.ml:7:20-62>vec.ml:6:2-11)") (callee "Vec.go") (action inline) (reason override) (override inline))
  ((key "D(Vec.sum_squares@vec.ml:7:16-62)/C(Vec.go@vec.ml:7:20-62>vec.ml:6:2-11)/I/C(Vec.go@vec.ml:5:44-64)") (callee "Vec.go") (action dont_inline) (reason (prevented unrolling_depth_exceeded)) (override dont_inline))
 ))
