(inlining_decisions
 (version 1)
 (unit "Vec")
 (round 2)
 (overrides (entries 0) (matched 0) (unmatched 0)
  (unmatched_keys ()))
 (decisions
  ((key "D(Vec.fold@vec.ml:4:9-99)/D(Vec.go@vec.ml:5:13-64)/C(Vec.go@vec.ml:5:44-64)") (callee "Vec.go") (action dont_inline) (reason (prevented self_call)))
  ((key "D(Vec.fold@vec.ml:4:9-99)/C(Vec.go@vec.ml:6:2-11)") (callee "Vec.go") (action inline) (reason heuristic) (detail without_subfunctions))
  ((key "D(Vec.fold@vec.ml:4:9-99)/C(Vec.go@vec.ml:6:2-11)/I/C(Vec.go@vec.ml:5:44-64)") (callee "Vec.go") (action dont_inline) (reason (prevented unrolling_depth_exceeded)))
  ((key "D(Vec.sum_squares@vec.ml:7:16-62)/D(Vec.go@vec.ml:5:13-64)/C(Vec.go@vec.ml:5:44-64)") (callee "Vec.go") (action dont_inline) (reason (prevented self_call)))
  ((key "D(Vec.sum_squares@vec.ml:7:16-62)/C(Vec.go@vec.ml:7:20-62>vec.ml:6:2-11)") (callee "Vec.go") (action inline) (reason heuristic) (detail without_subfunctions))
  ((key "D(Vec.sum_squares@vec.ml:7:16-62)/C(Vec.go@vec.ml:7:20-62>vec.ml:6:2-11)/I/C(Vec.go@vec.ml:5:44-64)") (callee "Vec.go") (action dont_inline) (reason (prevented unrolling_depth_exceeded)))
 ))
