(inlining_decisions
 (version 1)
 (unit "Main")
 (round 0)
 (overrides (entries 0) (matched 0) (unmatched 0)
  (unmatched_keys ()))
 (decisions
  ((key "C(Vec.sum_squares@main.ml:4:33-56)") (callee "Vec.sum_squares") (action dont_inline) (reason heuristic) (detail with_subfunctions))
  ((key "C(Stdlib__Printf.printf@main.ml:5:2-36)") (callee "Stdlib__Printf.printf") (action inline) (reason heuristic) (detail without_subfunctions))
  ((key "C(Stdlib__Printf.printf@main.ml:5:2-36)/I/C(CamlinternalFormat.make_printf@printf.ml:31:17-35>printf.ml:27:21-43>printf.ml:20:2-63)") (callee "CamlinternalFormat.make_printf") (action dont_inline) (reason (prevented unrolling_depth_exceeded)))
 ))
