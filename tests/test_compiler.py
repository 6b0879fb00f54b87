"""The patched compiler, driven on small OCaml programs written for these tests."""
from __future__ import annotations

import os
import subprocess

import pytest

from dispatcher.core.decisions import Override, dump_files, read_dump, read_dumps, write_overrides
from tests.helpers import (
    assert_subtrees_consistent,
    calls,
    compile_units,
    decisions_by_key,
    find,
    function_asm,
    link,
)


def test_options_are_listed_in_help(compiler):
    out = subprocess.run([str(compiler.ocamlopt), "-help"], capture_output=True, text=True).stdout
    assert "-inlining-overrides" in out and "-dump-inlining-decisions" in out


def test_force_inline_and_force_dont_inline(compiler, program):
    compile_units(compiler, program, ["util.ml", "main.ml"])
    base = decisions_by_key(program / "main.0.decisions.sexp")
    big_in_h = find(base, r"^D\(Main\.h@[^/]*\)/C\(Main\.big@")
    tiny_in_h = find(base, r"^D\(Main\.h@[^/]*\)/C\(Main\.tiny@")
    assert big_in_h.action == "dont_inline" and big_in_h.reason == "heuristic"
    assert tiny_in_h.action == "inline"
    asm = function_asm((program / "main.s").read_text(), "camlMain__h")
    assert calls(asm, "camlMain__big") == 1 and calls(asm, "camlMain__tiny") == 0

    # -O3 runs three rounds and each re-decides the sites still there: keeping a call
    # out of line takes a pin in every round.
    ov = write_overrides(program / "ov.sexp", [
        Override("Main", 0, big_in_h.key, "inline"),
        *[Override("Main", r, tiny_in_h.key, "dont_inline") for r in range(3)]])
    compile_units(compiler, program, ["main.ml"], overrides=ov)
    after = decisions_by_key(program / "main.0.decisions.sexp")
    assert (after[big_in_h.key].action, after[big_in_h.key].reason) == ("inline", "override")
    assert (after[tiny_in_h.key].action, after[tiny_in_h.key].reason) == ("dont_inline", "override")
    asm = function_asm((program / "main.s").read_text(), "camlMain__h")
    assert calls(asm, "camlMain__big") == 0 and calls(asm, "camlMain__tiny") == 1
    # The program still computes the same thing.
    exe = link(compiler, program, ["util.cmx", "main.cmx"])
    out = subprocess.run([str(exe), "100"], capture_output=True, text=True, check=True).stdout
    compile_units(compiler, program, ["main.ml"])
    ref = link(compiler, program, ["util.cmx", "main.cmx"], "ref.exe")
    assert out == subprocess.run([str(ref), "100"], capture_output=True, text=True).stdout


def test_path_sensitivity(compiler, program):
    """[big] reached through g inlined into f1 and into f2 gets a different decision in each."""
    compile_units(compiler, program, ["util.ml", "main.ml"])
    base = decisions_by_key(program / "main.0.decisions.sexp")
    # g's own body already had h inlined when g was declared, so the call frame of big
    # carries that route: the call of h in g, then the call of big in h.
    in_f1 = find(base, r"^D\(Main\.f1@[^/]*\)/C\(Main\.g@[^/]*\)/I/C\(Main\.big@main\.ml:7:[^>]*>main\.ml:6:")
    in_f2 = find(base, r"^D\(Main\.f2@[^/]*\)/C\(Main\.g@[^/]*\)/I/C\(Main\.big@main\.ml:7:[^>]*>main\.ml:6:")
    # Same callee, same source route of the call, different inlining paths.
    assert in_f1.key.rsplit("/", 1)[1] == in_f2.key.rsplit("/", 1)[1]
    assert in_f1.action == in_f2.action == "dont_inline"
    ov = write_overrides(program / "ov.sexp", [Override("Main", 0, in_f1.key, "inline")])
    compile_units(compiler, program, ["main.ml"], overrides=ov)
    after = decisions_by_key(program / "main.0.decisions.sexp")
    assert after[in_f1.key].action == "inline"
    assert after[in_f2.key].action == "dont_inline"
    asm = (program / "main.s").read_text()
    assert calls(function_asm(asm, "camlMain__f1"), "camlMain__big") == 0
    assert calls(function_asm(asm, "camlMain__f2"), "camlMain__big") == 1


def test_cross_module_inlining_through_cmx(compiler, program):
    compile_units(compiler, program, ["util.ml", "main.ml"])
    base = decisions_by_key(program / "main.0.decisions.sexp")
    add = find(base, r"^C\(Util\.add@main\.ml")
    assert add.callee == "Util.add" and add.action == "inline"
    ov = write_overrides(program / "ov.sexp",
                         [Override("Main", r, add.key, "dont_inline") for r in range(3)])
    compile_units(compiler, program, ["main.ml"], overrides=ov)
    assert decisions_by_key(program / "main.0.decisions.sexp")[add.key].action == "dont_inline"
    asm = (program / "main.s").read_text()
    assert calls(asm, "camlUtil__add") == 1
    # Without the .cmx the body is unknown: no decision at all, not a wrong one.
    (program / "util.cmx").unlink()
    compile_units(compiler, program, ["main.ml"], extra=["-w", "-58"])
    assert not [k for k in decisions_by_key(program / "main.0.decisions.sexp")
                if "Util.add" in k]


def test_o3_rounds_each_dumped_and_overridable(compiler, program):
    compile_units(compiler, program, ["util.ml", "main.ml"])
    dumps = read_dumps(p for p in dump_files(program) if p.name.startswith("main."))
    assert [d.round for d in dumps] == [0, 1, 2]
    # Round 1 works on round 0's output: its decisions have their own keys and round.
    round1 = dumps[1].decisions
    assert round1, "round 1 took no decisions"
    target = next(d for d in round1 if d.action == "dont_inline" and not d.prevented)
    ov = write_overrides(program / "ov.sexp", [Override("Main", 1, target.key, "inline")])
    compile_units(compiler, program, ["main.ml"], overrides=ov)
    after = decisions_by_key(program / "main.1.decisions.sexp")
    assert after[target.key].action == "inline" or after[target.key].prevented
    assert after[target.key].override == "inline"
    # The same key in round 0 is untouched by a round-1 override.
    r0 = read_dump(program / "main.0.decisions.sexp")
    assert all(d.override is None for d in r0.decisions)
    assert r0.override_entries == 0


def test_dump_is_deterministic_and_atomic(compiler, program):
    compile_units(compiler, program, ["util.ml", "main.ml"])
    first = {p.name: p.read_bytes() for p in dump_files(program)}
    compile_units(compiler, program, ["util.ml", "main.ml"])
    assert {p.name: p.read_bytes() for p in dump_files(program)} == first
    # No temporary files left beside the dumps.
    assert not [p for p in program.iterdir() if p.name.endswith(".tmp")]


def test_unmatched_override_keys_are_counted(compiler, program):
    compile_units(compiler, program, ["util.ml", "main.ml"])
    base = read_dump(program / "main.0.decisions.sexp")
    ov = write_overrides(program / "ov.sexp", [
        Override("Main", 0, base.decisions[0].key, base.decisions[0].action),
        Override("Main", 0, "D(Main.nowhere@main.ml:1:1-2)/C(Main.x@main.ml:1:1-2)", "inline"),
        Override("Util", 0, "C(Util.other@util.ml:1:1-2)", "inline")])
    compile_units(compiler, program, ["main.ml"], overrides=ov)
    after = read_dump(program / "main.0.decisions.sexp")
    assert (after.override_entries, after.overrides_matched) == (2, 1)
    assert after.unmatched_keys == ("D(Main.nowhere@main.ml:1:1-2)/C(Main.x@main.ml:1:1-2)",)


def test_ocamlparam_sets_both_options(compiler, program, tmp_path):
    compile_units(compiler, program, ["util.ml", "main.ml"])
    key = find(decisions_by_key(program / "main.0.decisions.sexp"),
               r"^D\(Main\.h@[^/]*\)/C\(Main\.tiny@").key
    ov = write_overrides(program / "ov.sexp", [Override("Main", 0, key, "dont_inline")])
    for p in dump_files(program):
        p.unlink()
    env = dict(os.environ, OCAMLPARAM=f"_,dump-inlining-decisions=1,inlining-overrides={ov}")
    compile_units(compiler, program, ["main.ml"], dump=False, env=env)
    assert decisions_by_key(program / "main.0.decisions.sexp")[key].action == "dont_inline"


def test_forced_inline_of_self_call_is_reported_prevented(compiler, tmp_path):
    (tmp_path / "main.ml").write_text(
        "let rec loop n acc = if n = 0 then acc else loop (n - 1) (acc + n)\n"
        "let () = print_int (loop (int_of_string Sys.argv.(1)) 0)\n")
    compile_units(compiler, tmp_path, ["main.ml"])
    base = decisions_by_key(tmp_path / "main.0.decisions.sexp")
    self_call = find(base, r"^D\(Main\.loop@[^/]*\)/C\(Main\.loop@")
    ov = write_overrides(tmp_path / "ov.sexp", [Override("Main", 0, self_call.key, "inline")])
    compile_units(compiler, tmp_path, ["main.ml"], overrides=ov)
    got = decisions_by_key(tmp_path / "main.0.decisions.sexp")[self_call.key]
    assert got.action == "dont_inline" and got.reason == "prevented"
    assert got.guard == "self_call" and got.override == "inline"


SPECULATIVE_ML = """\
let[@inline never] opaque x = x
let step a i = a.(i) <- a.(i) + opaque i
let fill a = for i = 0 to Array.length a - 1 do step a i; step a i done
let work a =
  fill a; fill a;
  let s = ref 0 in Array.iter (fun x -> s := !s + x) a; !s
let () =
  let a = Array.make (int_of_string Sys.argv.(1)) 0 in
  Printf.printf "%d %d\\n" (work a) (work a)
"""


def test_speculative_decisions_are_not_reported_as_taken(compiler, tmp_path):
    """Inside a rejected inlining attempt the inliner decides on inner calls; the
    -inlining-report shows them, the dump must not."""
    (tmp_path / "main.ml").write_text(SPECULATIVE_ML)
    compile_units(compiler, tmp_path, ["main.ml"], extra=["-inlining-report"])
    decisions = read_dump(tmp_path / "main.0.decisions.sexp").decisions
    by_key = {d.key: d for d in decisions}
    assert_subtrees_consistent(by_key)
    # The report does list calls below a call that was in the end not inlined.
    report = (tmp_path / "main.0.inlining.org").read_text()
    assert "not inlined" in report


MALFORMED = {
    "empty": ("", "1:1", "empty file"),
    "wrong_head": ("(overrides)", "1:1", "expected (inlining_overrides"),
    "unclosed": ("(inlining_overrides (version 1)\n (overrides\n", "2:2", "unclosed"),
    "extra_paren": ("(inlining_overrides (version 1) (overrides)))", "1:45", "unexpected ')'"),
    "unterminated_string": ('(inlining_overrides (version 1) (overrides ((key "abc', "1:50",
                            "unterminated string"),
    "bad_escape": ('(inlining_overrides (version 1) (overrides ((unit M) (round 0) '
                   '(key "a\\qb") (action inline))))', "1:71", "invalid escape"),
    "version": ("(inlining_overrides (version 7) (overrides))", "1:30", "unsupported version 7"),
    "missing_version": ("(inlining_overrides (overrides))", "1:1", "missing (version 1)"),
    "missing_overrides": ("(inlining_overrides (version 1))", "1:1", "missing (overrides"),
    "bad_action": ("(inlining_overrides (version 1) (overrides\n ((unit M) (round 0) (key k) "
                   "(action maybe))))", "2:38", "expected inline, dont_inline or specialise"),
    "bad_round": ("(inlining_overrides (version 1) (overrides\n ((unit M) (round -1) (key k) "
                  "(action inline))))", "2:19", "non-negative integer"),
    "missing_key": ("(inlining_overrides (version 1) (overrides\n ((unit M) (round 0) "
                    "(action inline))))", "2:2", "missing field (key"),
    "unknown_field": ("(inlining_overrides (version 1) (overrides\n ((unit M) (round 0) (key k) "
                      "(action inline) (colour red))))", "2:47", "unknown field colour"),
    "duplicate_field": ("(inlining_overrides (version 1) (overrides\n ((unit M) (unit N) (round 0) "
                        "(key k) (action inline))))", "2:13", "duplicate field unit"),
    "conflict": ("(inlining_overrides (version 1) (overrides\n ((unit M) (round 0) (key k) "
                 "(action inline))\n ((unit M) (round 0) (key k) (action dont_inline))))", "3:2",
                 "conflicting actions"),
    "entry_not_list": ("(inlining_overrides (version 1) (overrides oops))", "1:44",
                       "expected a list of (field value) pairs"),
    "two_forms": ("(inlining_overrides (version 1) (overrides))\n(inlining_overrides)", "2:1",
                  "unexpected second top-level form"),
}


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_malformed_overrides_file(compiler, tmp_path, kind):
    text, where, message = MALFORMED[kind]
    (tmp_path / "main.ml").write_text("let () = print_int (List.length [1; 2])\n")
    ov = tmp_path / f"{kind}.sexp"
    ov.write_text(text)
    proc = subprocess.run([str(compiler.ocamlopt), "-O3", "-inlining-overrides", str(ov),
                           "-c", "main.ml"], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "TMPDIR": str(tmp_path)})  # its .s stays here
    assert proc.returncode != 0
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr  # one line, no backtrace
    assert lines[0].startswith(f"{ov}:{where}: "), lines[0]
    assert message in lines[0]
    assert proc.stdout == ""


def test_missing_overrides_file(compiler, tmp_path):
    (tmp_path / "main.ml").write_text("let () = ()\n")
    proc = subprocess.run([str(compiler.ocamlopt), "-inlining-overrides", "nope.sexp",
                           "-c", "main.ml"], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    assert proc.returncode != 0
    assert proc.stderr.startswith("nope.sexp: cannot read") and len(proc.stderr.splitlines()) == 1
