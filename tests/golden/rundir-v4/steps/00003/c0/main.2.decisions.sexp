(inlining_decisions
 (version 1)
 (unit "Main")
 (round 2)
 (overrides (entries 8) (matched 4) (unmatched 4)
  (unmatched_keys ("C(CamlinternalFormat.make_printf@main.ml:5:2-36>printf.ml:31:17-35>printf.ml:27:21-43>printf.ml:20:2-63)" "C(CamlinternalFormat.make_printf@main.ml:5:2-36>printf.ml:31:17-35>printf.ml:27:21-43>printf.ml:20:2-63)/I/C(CamlinternalFormat.make_printf@camlinternalFormat.ml:1563:4-54)" "C(Vec.sum_squares@main.ml:4:33-56)/I/C(Main.go@vec.ml:7:20-62>vec.ml:6:2-11>vec.ml:5:44-64)" "C(Vec.sum_squares@main.ml:4:33-56)/I/D(Main.go@vec.ml:5:13-64)/C(Main.go@vec.ml:5:44-64)")))
 (decisions
  ((key "D(Main.go@vec.ml:5:13-64)/C(Main.go@vec.ml:5:44-64)") (callee "Main.go") (action dont_inline) (reason (prevented self_call)) (override dont_inline))
  ((key "C(Main.go@main.ml:4:33-56>vec.ml:7:20-62>vec.ml:6:2-11>vec.ml:5:44-64)") (callee "Main.go") (action inline) (reason override) (override inline))
  ((key "C(Main.go@main.ml:4:33-56>vec.ml:7:20-62>vec.ml:6:2-11>vec.ml:5:44-64)/I/C(Main.go@vec.ml:5:44-64)") (callee "Main.go") (action dont_inline) (reason (prevented unrolling_depth_exceeded)) (override dont_inline))
  ((key "C(Stdlib__Printf.printf@main.ml:5:2-36)") (callee "Stdlib__Printf.printf") (action dont_inline) (reason override) (override dont_inline))
 ))
