"""The policy channel end to end, with the real compiler: the compiler asking a host (a
scripted one, and ``dispatcher.build.policy_host`` with each built-in policy), what wins over what,
and every way a host can fail (one line from the compiler, never a hang)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dispatcher.build.manifest import resolve_benchmark
from dispatcher.build.policies import (
    Advice,
    HeuristicPolicy,
    NeverInlinePolicy,
    Observation,
    PolicyError,
    PolicySpec,
    parse_policy,
)
from dispatcher.build.policy_host import PolicyHost
from dispatcher.build.service import CompileError, CompileJob, CompileService
from dispatcher.core.decisions import (
    Override,
    dump_files,
    parse_dump,
    read_dump,
    write_overrides,
)
from dispatcher.storage.store import Store, compile_key
from tests.helpers import (
    FEATURES_ML,
    REPO,
    calls,
    compile_units,
    decisions_by_key,
    find,
    function_asm,
    invoke,
    link,
    one_line_error,
    write_config,
)


class Recording:
    """A policy that records what it was asked and answers with ``answer(observation)``."""

    def __init__(self, answer=lambda o: Advice.DEFAULT):
        self.answer = answer
        self.seen: list[Observation] = []

    def decide(self, observation: Observation) -> Advice:
        self.seen.append(observation)
        return self.answer(observation)


def compile_with(compiler, workdir: Path, units, host: PolicyHost, **kwargs):
    return compile_units(compiler, workdir, units, extra=host.options, **kwargs)


# -- the compiler asking a host

def test_policy_keeps_a_call_the_heuristic_inlines(compiler, program):
    compile_units(compiler, program, ["util.ml", "main.ml"])
    base = decisions_by_key(program / "main.0.decisions.sexp")
    tiny_key = find(base, r"^D\(Main\.h@[^/]*\)/C\(Main\.tiny@").key
    assert base[tiny_key].action == "inline"
    policy = Recording(lambda o: Advice.DONT_INLINE)
    with PolicyHost(policy) as host:
        compile_with(compiler, program, ["main.ml"], host)
    assert [s.unit for s in host.sessions] == ["Main"] and host.sessions[0].ended
    assert not host.errors
    after = decisions_by_key(program / "main.0.decisions.sexp")
    tiny = after[tiny_key]
    assert (tiny.action, tiny.reason, tiny.advice, tiny.heuristic) == (
        "dont_inline", "policy", "dont_inline", "inline")
    # Every decision was asked; each one is the advice, unless a guard stood in the way.
    assert all(d.advice == "dont_inline" for d in after.values())
    assert all(d.action == "dont_inline" and d.reason in ("policy", "prevented")
               for d in after.values())
    asm = function_asm((program / "main.s").read_text(), "camlMain__h")
    assert calls(asm, "camlMain__tiny") == 1 and calls(asm, "camlMain__big") == 1
    # The observations carried what the dump shows.
    asked = {(o.round, o.key): o for o in policy.seen}
    assert asked[(0, tiny_key)].heuristic_action == "inline"
    assert asked[(0, tiny_key)].features == tiny.features
    # The program still computes the same thing.
    exe = link(compiler, program, ["util.cmx", "main.cmx"])
    out = subprocess.run([str(exe), "50"], capture_output=True, text=True, check=True).stdout
    compile_units(compiler, program, ["main.ml"])
    ref = link(compiler, program, ["util.cmx", "main.cmx"], "ref.exe")
    assert out == subprocess.run([str(ref), "50"], capture_output=True, text=True).stdout


def test_policy_inlines_a_call_the_heuristic_keeps(compiler, program):
    compile_units(compiler, program, ["util.ml", "main.ml"])
    base = decisions_by_key(program / "main.0.decisions.sexp")
    big_key = find(base, r"^D\(Main\.h@[^/]*\)/C\(Main\.big@").key
    assert base[big_key].action == "dont_inline" and base[big_key].reason == "heuristic"
    policy = Recording(lambda o: Advice.INLINE if (o.round, o.key) == (0, big_key)
                       else Advice.DEFAULT)
    with PolicyHost(policy) as host:
        compile_with(compiler, program, ["main.ml"], host)
    big = decisions_by_key(program / "main.0.decisions.sexp")[big_key]
    assert (big.action, big.reason, big.advice, big.heuristic) == (
        "inline", "policy", "inline", "dont_inline")
    asm = function_asm((program / "main.s").read_text(), "camlMain__h")
    assert calls(asm, "camlMain__big") == 0


def test_overrides_win_over_the_policy(compiler, program):
    """An overridden site is not asked: the override decides it."""
    compile_units(compiler, program, ["util.ml", "main.ml"])
    base = decisions_by_key(program / "main.0.decisions.sexp")
    tiny_key = find(base, r"^D\(Main\.h@[^/]*\)/C\(Main\.tiny@").key
    ov = write_overrides(program / "ov.sexp", [Override("Main", 0, tiny_key, "dont_inline")])
    policy = Recording(lambda o: Advice.INLINE)
    with PolicyHost(policy) as host:
        compile_with(compiler, program, ["main.ml"], host, overrides=ov)
    tiny = decisions_by_key(program / "main.0.decisions.sexp")[tiny_key]
    assert (tiny.action, tiny.reason, tiny.override, tiny.advice) == (
        "dont_inline", "override", "dont_inline", None)
    assert (0, tiny_key) not in {(o.round, o.key) for o in policy.seen}
    assert policy.seen  # the other sites were asked


def test_heuristic_policy_builds_what_the_heuristic_builds(compiler, program):
    compile_units(compiler, program, ["util.ml", "main.ml"])
    asm = (program / "main.s").read_text()
    dumps = {p.name: p.read_text() for p in dump_files(program) if p.name.startswith("main.")}
    with PolicyHost(HeuristicPolicy()) as host:
        compile_with(compiler, program, ["main.ml"], host)
    assert (program / "main.s").read_text() == asm
    for name, text in dumps.items():
        with_policy = (program / name).read_text()
        assert "(advice default)" in with_policy
        assert [(d.key, d.action, d.features) for d in parse_dump(with_policy).decisions] == \
            [(d.key, d.action, d.features) for d in parse_dump(text).decisions]


def test_a_session_per_unit_and_deterministic_dumps(compiler, program):
    """One ocamlopt compiling two units opens two sessions, one after the other; the same
    answers give byte-identical dumps."""
    texts = []
    for _ in range(2):
        with PolicyHost(NeverInlinePolicy()) as host:
            proc = subprocess.run([str(compiler.ocamlopt), "-O3", "-dump-inlining-decisions",
                                   *host.options, "-c", "util.ml", "main.ml"],
                                  cwd=program, capture_output=True, text=True)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
        assert [(s.unit, s.ended, s.error) for s in host.sessions] == [
            ("Util", True, None), ("Main", True, None)]
        texts.append({p.name: p.read_bytes() for p in dump_files(program)})
    assert texts[0] == texts[1]


def test_channel_through_ocamlparam(compiler, program):
    compile_units(compiler, program, ["util.ml"])
    with PolicyHost(NeverInlinePolicy()) as host:
        env = dict(os.environ, OCAMLPARAM=f"_,dump-inlining-decisions=1,"
                                          f"inlining-policy-channel={host.base},"
                                          f"inlining-policy-timeout=30")
        compile_units(compiler, program, ["main.ml"], dump=False, env=env)
    assert host.sessions[0].observations > 0
    reasons = {d.reason for d in read_dump(program / "main.0.decisions.sexp").decisions}
    assert "policy" in reasons


# -- hosts that fail

# A host written against the protocol by hand, standing alone (it must be killable), that
# misbehaves as told once the compiler asks its first question.
RAW_HOST = r"""
import os, select, sys, time
base, mode = sys.argv[1], sys.argv[2]
os.mkfifo(base + ".out"); os.mkfifo(base + ".in")
out = os.open(base + ".out", os.O_RDONLY | os.O_NONBLOCK)
print("ready", flush=True)
pending = b""
def line():
    global pending
    while b"\n" not in pending:
        select.select([out], [], [])
        chunk = os.read(out, 65536)
        if not chunk:
            sys.exit(0)
        pending += chunk
    text, pending = pending.split(b"\n", 1)
    return text
line()
inn = os.open(base + ".in", os.O_WRONLY)
if mode == "bad-header":
    os.write(inn, b"(hello)\n")
elif mode == "bad-version":
    os.write(inn, b"(inlining_policy_host (version 9))\n")
else:
    os.write(inn, b"(inlining_policy_host (version 1))\n")
line()
if mode == "garbage":
    os.write(inn, b"maybe\n")
elif mode == "die":
    os._exit(3)
elif mode == "close":
    os.close(inn)
time.sleep(60)
"""

FAILURES = {
    "garbage": 'expected inline, dont_inline or default on {base}.in, got "maybe"',
    "die": "the host closed {base}.in (waiting for its advice)",
    "close": "the host closed {base}.in (waiting for its advice)",
    "hang": "no advice from the host on {base}.in within 1 s",
    "bad-header": "expected the host's header (inlining_policy_host (version 1)) on "
                  '{base}.in, got "(hello)"',
    "bad-version": "the host speaks version 9 of the protocol, expected 1",
}


def run_compiler(compiler, workdir: Path, *options: str, env=None):
    (workdir / "main.ml").write_text(FEATURES_ML)
    t0 = time.monotonic()
    # TMPDIR: the compiler's temporary .s, which it leaves when it stops early, in workdir
    proc = subprocess.run([str(compiler.ocamlopt), "-O3", *options, "-c", "main.ml"],
                          cwd=workdir, capture_output=True, text=True, timeout=120,
                          env={**(os.environ if env is None else env), "TMPDIR": str(workdir)})
    return proc, time.monotonic() - t0


def assert_one_line(proc, base: Path, message: str) -> None:
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [f"inlining policy channel {base}: {message}"]


@pytest.mark.parametrize("mode", sorted(FAILURES))
def test_a_failing_host_stops_the_compiler_in_one_line(compiler, tmp_path, mode):
    base = tmp_path / "chan"
    host = subprocess.Popen([sys.executable, "-c", RAW_HOST, str(base), mode],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert host.stdout is not None and host.stdout.readline() == "ready\n"
        proc, took = run_compiler(compiler, tmp_path, "-inlining-policy-channel", str(base),
                                  "-inlining-policy-timeout", "1")
    finally:
        host.kill()
        host.wait()
    assert_one_line(proc, base, FAILURES[mode].format(base=base))
    assert took < 30


def test_no_host_or_a_bad_timeout(compiler, tmp_path):
    base = tmp_path / "chan"
    proc, _ = run_compiler(compiler, tmp_path, "-inlining-policy-channel", str(base))
    assert_one_line(proc, base, f"cannot open {base}.out for writing ({base}.out: No such "
                                f"file or directory): no policy host is listening there")
    os.mkfifo(f"{base}.out")
    os.mkfifo(f"{base}.in")
    proc, took = run_compiler(compiler, tmp_path, "-inlining-policy-channel", str(base))
    assert_one_line(proc, base, f"cannot open {base}.out for writing ({base}.out: No such "
                                f"device or address): no policy host is listening there")
    assert took < 30  # at once: nobody reading is not waited for
    env = dict(os.environ, OCAMLPARAM=f"_,inlining-policy-channel={base},"
                                      f"inlining-policy-timeout=soon")
    proc, _ = run_compiler(compiler, tmp_path, env=env)
    assert_one_line(proc, base, 'timeout "soon": expected a number of seconds above 0 and at '
                                'most 86400')


# -- the Python host and its policies in the compile service

def test_compile_key_without_a_policy_is_unchanged():
    """Keys of compiles that name no policy are those the store always had (computed before
    policies existed): their stored candidates stay valid."""
    assert compile_key("compiler", "sources", ("-O3",), "") == \
        "dd167c27fd52aef3522fce08b3b44007b2e885a0c28b6e1c665cf35a848442e7"
    assert compile_key("compiler", "sources", ("-O3",), "", "heuristic") != \
        compile_key("compiler", "sources", ("-O3",), "")


def test_built_in_policies_through_the_compile_service(compiler, tmp_path):
    bench = resolve_benchmark("kahan")
    service = CompileService(Store(tmp_path / "store"), compiler)
    try:
        plain = service.compile(CompileJob(bench))
        heuristic = service.compile(CompileJob(bench, policy=parse_policy("heuristic")))
        # Asking and always hearing "default" builds the heuristic's binary, under its own key.
        assert heuristic.sha256 == plain.sha256
        assert heuristic.artifact.key != plain.artifact.key and not heuristic.cached
        assert all(d.advice == "default" for dump in heuristic.artifact.dumps()
                   for d in dump.decisions)

        never = service.compile(CompileJob(bench, policy=parse_policy("never-inline")))
        decisions = [d for dump in never.artifact.dumps() for d in dump.decisions]
        assert decisions and all(d.action == "dont_inline" for d in decisions)
        assert {d.reason for d in decisions} <= {"policy", "prevented"}
        assert never.sha256 != plain.sha256

        # A decision file: its action where it has one, the heuristic's elsewhere.
        dumps = plain.artifact.dumps()
        site = next(d for dump in dumps for d in dump.decisions
                    if d.round == 0 and d.action == "inline" and d.reason == "heuristic")
        optimal = write_overrides(tmp_path / "optimal.sexp",
                                  [Override(site.unit, 0, site.key, "dont_inline")])
        spec = parse_policy(str(optimal))
        assert spec.kind == "decisions" and spec.identity().startswith("decisions:sha256:")
        filed = service.compile(CompileJob(bench, policy=spec))
        by_key = {(d.unit, d.round, d.key): d for dump in filed.artifact.dumps()
                  for d in dump.decisions}
        flipped = by_key[(site.unit, 0, site.key)]
        assert (flipped.action, flipped.reason, flipped.advice) == (
            "dont_inline", "policy", "dont_inline")
        assert sum(d.advice != "default" for d in by_key.values()) == 1
        # The same policy again is a cache hit.
        assert service.compile(CompileJob(bench, policy=parse_policy(str(optimal)))).cached
    finally:
        service.close()


class Broken:
    def decide(self, observation: Observation) -> Advice:
        raise ZeroDivisionError("no model")


def test_a_failing_policy_is_one_compile_error(compiler, tmp_path, monkeypatch):
    from dispatcher.build import policies as policy_module
    monkeypatch.setitem(policy_module.POLICY_KINDS, "broken", lambda spec: Broken())
    service = CompileService(Store(tmp_path / "store"), compiler)
    try:
        with pytest.raises(CompileError) as err:
            service.compile(CompileJob(resolve_benchmark("kahan"), policy=PolicySpec("broken")))
    finally:
        service.close()
    message = str(err.value)
    assert "\n" not in message and "policy broken: unit " in message
    assert "ZeroDivisionError: no model" in message and "the host closed" in message


def test_bad_policy_names_and_files_in_one_line(tmp_path):
    with pytest.raises(PolicyError) as err:
        parse_policy("bogus")
    assert str(err.value) == ("policy 'bogus': expected heuristic, never-inline, "
                              "always-inline, the path of an overrides file (.sexp) or of a policy file train-policy "
                              "wrote (.policy)")
    (tmp_path / "junk.policy").write_text("not a pickle")
    for name, message in ((str(tmp_path / "none.policy"), "cannot read"),
                          (str(tmp_path / "junk.policy"), "not a policy file")):
        with pytest.raises(PolicyError) as err:
            parse_policy(name)
        assert str(err.value).startswith(f"policy {name}") and message in str(err.value)
        assert "\n" not in str(err.value)
    (tmp_path / "bad.sexp").write_text("(inlining_overrides (version 1) (overrides oops))")
    for name, message in ((str(tmp_path / "none.sexp"), "cannot read"),
                          (str(tmp_path / "bad.sexp"), "expected")):
        with pytest.raises(PolicyError) as err:
            parse_policy(name)
        assert str(err.value).startswith(f"policy {name}: ") and message in str(err.value)
        assert "\n" not in str(err.value)
    for arg, start in (("bogus", "run-benchmark: policy 'bogus': expected heuristic"),
                       (str(tmp_path / "bad.sexp"),
                        f"run-benchmark: policy {tmp_path}/bad.sexp: ")):
        result = invoke("run-benchmark", "kahan", "--policy", arg, cwd=REPO)
        assert one_line_error(result).startswith(start) and result.stdout == ""


def test_observations_parse_as_the_compiler_writes_them():
    line = ('(observation (seq 3) (unit "Main") (round 1) (key "C(Main.f@m.ml:1:1-5)") '
            '(callee "Main.f") (heuristic (action dont_inline) (reason (prevented self_call))) '
            '(features (round 1) (depth 0) (args 1) (known_args 1) (callee_size 9) '
            '(toplevel true) (branch_depth 0) (recursive true) (self_call true) '
            '(in_loop false) (in_recursive_function true) (via_stub false) '
            '(inline_attribute (unroll 2)) (inlined_attribute default) '
            '(specialise_attribute default) (specialised_attribute never)))')
    from dispatcher.build.policies import parse_observation
    o = parse_observation(line)
    assert (o.seq, o.unit, o.round, o.heuristic_action, o.heuristic_reason,
            o.heuristic_guard) == (3, "Main", 1, "dont_inline", "prevented", "self_call")
    assert o.features.threshold is None and o.features.inline_attribute == "(unroll 2)"
    assert o.features.specialised_attribute == "never" and o.features.evaluation is None


def test_the_fast_observation_reader_reads_as_the_generic_one(compiler, tmp_path,
                                                              monkeypatch):
    """Every line real compiles of two benchmarks sent reads the same through the fast
    path (regular expressions on the compiler's layout) and the s-expression reader."""
    import dispatcher.build.policy_host as host_module
    from dispatcher.build.driver import PolicyChannel, build_benchmark
    from dispatcher.build.policies import HeuristicPolicy, parse_observation_generic
    lines: list[str] = []
    real = host_module.parse_observation
    monkeypatch.setattr(host_module, "parse_observation",
                        lambda line: (lines.append(line), real(line))[1])
    for name in ("kahan", "bdd"):
        with PolicyHost(HeuristicPolicy()) as host:
            build_benchmark(resolve_benchmark(name), tmp_path / name, compiler.ocamlopt,
                            dump_decisions=True, policy=PolicyChannel(host.base, "h"))
    assert len(lines) > 500
    import dispatcher.build.policies as policy_module
    fast = [policy_module._OBSERVATION_HEAD.match(
        line[:policy_module._OBSERVATION_FEATURES.search(line).start()] + ")") is not None
        for line in lines]
    assert sum(fast) > 0.95 * len(lines)  # the fast path is the one taken
    reasons = set()
    for line in lines:
        o = real(line)
        assert o == parse_observation_generic(line), line
        reasons.add((o.heuristic_reason, o.heuristic_detail is not None,
                     o.features.evaluation is not None))
    assert len(reasons) >= 3  # prevented, attribute or heuristic; with and without details


def test_run_benchmark_with_a_policy(tmp_path):
    config = write_config(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "commands", "run-benchmark", "kahan",
                           "--policy", "never-inline", "--config", str(config), "--runs", "1",
                           "--no-compare"], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stdout.splitlines()
    worker, label, time_s = line.split(",")
    assert label == "policy:never-inline" and float(time_s) > 0
