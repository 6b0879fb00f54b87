(inlining_decisions
 (version 1)
 (unit "Main")
 (round 0)
 (overrides (entries 3) (matched 3) (unmatched 0)
  (unmatched_keys ()))
 (decisions
  ((key "C(Vec.sum_squares@main.ml:4:33-56)") (callee "Vec.sum_squares") (action inline) (reason override) (override inline))
  ((key "C(Vec.sum_squares@main.ml:4:33-56)/I/D(Main.go@vec.ml:5:13-64)/C(Main.go@vec.ml:5:44-64)") (callee "Main.go") (action dont_inline) (reason (prevented self_call)))
  ((key "C(Vec.sum_squares@main.ml:4:33-56)/I/C(Main.go@vec.ml:7:20-62>vec.ml:6:2-11>vec.ml:5:44-64)") (callee "Main.go") (action dont_inline) (reason (prevented unrolling_depth_exceeded)))
  ((key "C(Stdlib__Printf.printf@main.ml:5:2-36)") (callee "Stdlib__Printf.printf") (action inline) (reason override) (override inline))
  ((key "C(Stdlib__Printf.printf@main.ml:5:2-36)/I/C(CamlinternalFormat.make_printf@printf.ml:31:17-35>printf.ml:27:21-43>printf.ml:20:2-63)") (callee "CamlinternalFormat.make_printf") (action dont_inline) (reason override) (override dont_inline))
 ))
