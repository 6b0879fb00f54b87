"""Features in the decision dump (version 2), with the real compiler: what each one says of
real call sites, and that version-1 dumps still read."""
from __future__ import annotations

import pytest

from dispatcher.core.decisions import (
    DecisionFileError,
    Features,
    feature_rows,
    parse_dump,
    read_dump,
)
from tests.helpers import FEATURES_ML, compile_units, decisions_by_key, find


def test_dump_carries_features(compiler, program):
    compile_units(compiler, program, ["util.ml", "main.ml"])
    dump = read_dump(program / "main.0.decisions.sexp")
    assert dump.decisions and all(isinstance(d.features, Features) for d in dump.decisions)
    by_key = {d.key: d for d in dump.decisions}
    tiny = find(by_key, r"^D\(Main\.h@[^/]*\)/C\(Main\.tiny@").features
    big = find(by_key, r"^D\(Main\.h@[^/]*\)/C\(Main\.big@").features
    assert (tiny.round, tiny.args, tiny.known_args, tiny.depth) == (0, 1, 0, 0)
    assert tiny.callee_size < big.callee_size and tiny.threshold and tiny.threshold > 0
    # The heuristic evaluated tiny's benefit (and inlined it); big it refused unseen.
    assert tiny.evaluation == "inline" and tiny.accepted and tiny.remove_call == 1
    assert tiny.size_before is not None and tiny.size_after is not None
    assert big.evaluation is None and big.size_after is None
    h_in_g = find(by_key, r"^D\(Main\.g@[^/]*\)/C\(Main\.h@[^/]*$")
    assert h_in_g.reason == "attribute" and h_in_g.features.inline_attribute == "always"
    in_loop = find(by_key, r"^C\(Main\.f1@main\.ml:13:[^/]*$").features
    assert in_loop.toplevel and in_loop.in_loop and not in_loop.recursive
    row = tiny.row()
    assert list(row) == [f for f in Features.__dataclass_fields__] and row["args"] == 1
    rows = feature_rows([dump])
    assert len(rows) == len(dump.decisions)
    assert rows[0]["key"] == dump.decisions[0].key and rows[0]["depth"] == 0


def test_loops_recursion_stubs_and_known_arguments(compiler, tmp_path):
    (tmp_path / "main.ml").write_text(FEATURES_ML)
    compile_units(compiler, tmp_path, ["main.ml"])
    by_key = decisions_by_key(tmp_path / "main.0.decisions.sexp")
    in_rec = find(by_key, r"^D\(Main\.loop@[^/]*\)/C\(Main\.tiny@").features
    assert in_rec.in_recursive_function and not in_rec.in_loop
    self_call = find(by_key, r"^D\(Main\.loop@[^/]*\)/C\(Main\.loop@").features
    assert self_call.recursive and self_call.self_call and self_call.args == 2
    in_while = find(by_key, r"^D\(Main\.spin@[^/]*\)/C\(Main\.tiny@").features
    assert in_while.in_loop and not in_while.in_recursive_function
    assert find(by_key, r"^C\(Main\.tiny@main\.ml:5:").features.known_args == 1
    # opt's optional argument makes a stub (always inlined, no decision) that calls the
    # function's body: that call is the decision, reached through the stub.
    through_stub = find(by_key, r"^C\(Main\.opt_inner@").features
    assert through_stub.via_stub and through_stub.known_args == 2
    assert not any(d.features.via_stub for k, d in by_key.items() if "opt_inner" not in k)


def test_version_1_and_2_dumps_read(compiler, tmp_path):
    v1 = ('(inlining_decisions\n (version 1)\n (unit "Main")\n (round 0)\n'
          ' (overrides (entries 0) (matched 0) (unmatched 0)\n  (unmatched_keys ()))\n'
          ' (decisions\n  ((key "C(Main.f@m.ml:1:1-5)") (callee "Main.f") (action inline) '
          '(reason heuristic) (detail without_subfunctions))\n ))\n')
    (old,) = parse_dump(v1, "v1.sexp").decisions
    assert old.features is None and old.advice is None and old.action == "inline"
    (tmp_path / "main.ml").write_text(FEATURES_ML)
    compile_units(compiler, tmp_path, ["main.ml"])
    text = (tmp_path / "main.0.decisions.sexp").read_text()
    assert "(version 2)" in text
    assert all(d.features for d in parse_dump(text).decisions)
    # A version-2 dump with a feature the reader does not know, or a missing one, or a
    # version it does not read: one line naming the file.
    for bad, message in ((text.replace("(via_stub false)", "(via_stub maybe)", 1),
                          "via_stub: expected true or false"),
                         (text.replace(" (callee_size ", " (size_of_callee ", 1),
                          "unknown field"),
                         (text.replace("(version 2)", "(version 3)"), "version 3, expected"),
                         (v1.replace("(detail without_subfunctions)",
                                     "(features (round 0))"), "features in a version 1")):
        with pytest.raises(DecisionFileError) as err:
            parse_dump(bad, "bad.sexp")
        assert str(err.value).startswith("bad.sexp: ") and message in str(err.value)
        assert "\n" not in str(err.value)


def test_features_are_deterministic(compiler, tmp_path):
    """Same source, same options: byte-identical dumps, features included."""
    (tmp_path / "main.ml").write_text(FEATURES_ML)
    runs = []
    for _ in range(2):
        compile_units(compiler, tmp_path, ["main.ml"])
        runs.append({p.name: p.read_bytes() for p in sorted(tmp_path.glob("*.decisions.sexp"))})
    assert runs[0] == runs[1] and b"(features " in runs[0]["main.0.decisions.sexp"]
