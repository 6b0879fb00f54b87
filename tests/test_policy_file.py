"""Policy files are data, evaluated alike by our Python evaluator and by the compiler.

Policies trained on real features (the heuristic builds' dumps of bundled benchmarks) with a
planted labelling rule: the exported evaluator reproduces scikit-learn's ``predict`` on every
training row (only exact near-ties may differ, and they are reported); then, with the real
compiler, ``ocamlopt -inlining-policy FILE`` answers every decision as the Python host
serving the same file does (same dumps, advice included, and the same binaries, over several
bundled programs), with both ``inline`` and ``dont_inline`` answers changing the heuristic's
decisions; a malformed or pickled file is one line from the compiler."""
from __future__ import annotations

import dataclasses
import hashlib
import os
import pickle
import re
import subprocess
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from analysis.policy_training import KEY, encode, fit_model, train
from dispatcher.build.driver import PolicyChannel, PolicyFile, build_benchmark
from dispatcher.build.manifest import resolve_benchmark
from dispatcher.build.policies import (
    AlwaysInlinePolicy,
    LearnedPolicy,
    PolicySpec,
    compiler_policy_file,
    parse_policy,
)
from dispatcher.build.policy_file import (
    Column,
    Constant,
    ExportError,
    Node,
    PolicyEvaluation,
    PolicyFileError,
    TrainedPolicy,
    Tree,
    Trees,
    answer,
    decode_policy_file,
    function_of_key,
    growth,
    policy_text,
    read_policy_file,
    save_policy_file,
)
from dispatcher.build.policy_host import PolicyHost
from dispatcher.core.decisions import read_dump

TRAINING = ("kahan", "hamming", "bdd", "lens")
SMALL_BUDGET = 30  # callee_size units: binds where a function gets a second departure
DISCOUNT = (("known_args", 0.5), ("in_loop", 1.0))  # format version 2
OTHERS = ("sieve", "nqueens", "richards")  # never seen in training


def planted(row: dict) -> str:
    """Labels that disagree with the heuristic both ways: keep small callees out of line
    outside loops, inline mid-sized ones; a pseudo-random tenth of sites flipped (by key), so
    that the models are not certain everywhere."""
    noise = int(hashlib.sha256(row["key"].encode()).hexdigest()[:4], 16) % 10 == 0
    size = row["callee_size"]
    if size <= 12 and not row["in_loop"]:
        label = "dont_inline"
    elif 20 <= size <= 80:
        label = "inline"
    else:
        label = "default"
    if noise:
        label = {"inline": "default", "default": "dont_inline", "dont_inline": "inline"}[label]
    return label


@pytest.fixture(scope="module")
def sites(bundled_builds):
    """The training table: every decision the heuristic took freely in the training
    benchmarks' builds, with its features and a planted label."""
    rows = []
    bundled_builds.prefetch([resolve_benchmark(name) for name in TRAINING], dumps=True)
    for name in TRAINING:
        built = bundled_builds.get(resolve_benchmark(name), dumps=True)
        for path in built.decision_files:
            for d in read_dump(path).decisions:
                if d.features is not None and d.reason == "heuristic":
                    row = {"benchmark": name, "unit": d.unit, "round": d.round, "key": d.key,
                           **d.features.row()}
                    row["label"] = planted(row)
                    rows.append(row)
    table = pd.DataFrame(rows).drop_duplicates(["benchmark", *KEY])
    assert set(table["label"]) == {"inline", "dont_inline", "default"}
    return encode(table)


@pytest.mark.parametrize("name", ["logistic", "boosted", "mlp"])
def test_the_exported_evaluator_predicts_as_scikit_learn(sites, name, tmp_path):
    """Every training row: our evaluator of the file (read back) answers as scikit-learn's
    predict, but for rows where the model's two best scores tie to within rounding."""
    model = fit_model(sites, name)
    path = tmp_path / "p.policy"
    save_policy_file(train(sites, name, 0.0), path)
    policy = read_policy_file(path)
    X = sites.features.to_numpy()
    theirs = model.predict(X)
    assert len(set(theirs)) > 1  # a model that answers more than one thing
    raw = (model.decision_function(X) if name == "logistic" else
           model._raw_predict(X) if name == "boosted" else None)
    differ = near_ties = 0
    for i, x in enumerate(X):
        scores = policy.model_scores(list(x))
        ours = answer(policy.classes, scores)[0]
        if ours != theirs[i]:
            differ += 1
            # a near tie: the two best scores (or a binary score and 0) within 1e-9
            s = sorted(scores, reverse=True) + [0.0]
            near_ties += (abs(s[0] - s[1]) if len(scores) > 1 else abs(scores[0])) < 1e-9
        if raw is not None:  # the scores themselves agree to rounding
            r = raw[i] if getattr(raw[i], "__len__", None) else [raw[i]]
            assert max(abs(a - b) for a, b in zip(scores, r)) < 1e-9 * (1 + max(map(abs, r)))
    print(f"{name}: {differ} of {len(X)} training rows differ from scikit-learn, "
          f"{near_ties} of them exact near-ties")
    assert differ == near_ties


def _constant(sites):
    one = sites.labels.copy()
    one[:] = "inline"
    return type(sites)(sites.features, one, sites.benchmarks)


@pytest.fixture(scope="module")
def policies(sites, tmp_path_factory):
    """Policy files over real features: a tree model, a linear one and an MLP, with the
    default guard rails; and the boosted one without them."""
    tmp = tmp_path_factory.mktemp("policies")
    out = {}
    trained = {name: train(sites, name, 0.0) for name in ("boosted", "logistic", "mlp")}
    # the guard rails are the file's, not the fit's: one boosted model under each
    for name, rails in (("boosted", {}), ("logistic", {}), ("mlp", {}),
                        ("boosted-bare", {"margin": 0.0, "ranges": False,
                                          "growth_budget": None}),
                        ("boosted-unbudgeted", {"growth_budget": None}),
                        ("boosted-budget", {"growth_budget": SMALL_BUDGET}),
                        ("boosted-discount", {"growth_budget": SMALL_BUDGET,
                                              "growth_discount": DISCOUNT})):
        path = tmp / f"{name}.policy"
        save_policy_file(dataclasses.replace(trained[name.split("-")[0]], **rails), path)
        out[name] = path
    path = tmp / "constant.policy"
    save_policy_file(train(_constant(sites), "boosted", 0.0), path)
    out["constant"] = path
    return out


def _build(compiler, bench: str, outdir: Path, policy) -> dict[str, bytes]:
    built = build_benchmark(resolve_benchmark(bench), outdir, compiler.ocamlopt,
                            dump_decisions=True, policy=policy)
    files = {p.name: p.read_bytes() for p in built.decision_files}
    files["binary"] = built.binary.read_bytes()
    return files


@pytest.mark.parametrize("which", ["boosted", "logistic", "mlp", "boosted-bare", "constant",
                                   "boosted-budget", "boosted-discount"])
def test_the_compiler_answers_as_the_python_host(compiler, policies, which, tmp_path):
    """For the same file, the compiler's own evaluation and the Python host's answer every
    decision alike: identical dumps (each decision's advice and the heuristic's action) and
    identical binaries, on training benchmarks and on benchmarks never seen."""
    path = policies[which]
    data = path.read_bytes()
    spec = PolicySpec("learned", source=str(path), digest=hashlib.sha256(data).hexdigest(),
                      trained=read_policy_file(path), data=data)
    advice: Counter = Counter()
    for bench in (TRAINING[0], *OTHERS):
        in_compiler = _build(compiler, bench, tmp_path / bench / "file",
                             PolicyFile(path, spec.identity()))
        with PolicyHost(LearnedPolicy(spec)) as host:
            hosted = _build(compiler, bench, tmp_path / bench / "host",
                            PolicyChannel(host.base, spec.identity()))
        assert not host.errors
        assert sorted(in_compiler) == sorted(hosted)
        for name, text in in_compiler.items():
            assert text == hosted[name], (which, bench, name)
        for name in in_compiler:
            if name != "binary":
                for d in read_dump(tmp_path / bench / "file" / name).decisions:
                    if d.advice is not None:
                        advice[(d.advice, d.heuristic == d.advice, d.reason)] += 1
    print(which, dict(advice))
    if which in ("boosted-budget", "boosted-discount"):
        _check_the_budget_binds(spec.trained, tmp_path)
    asked = sum(advice.values())
    assert asked > 200
    if which == "constant":  # inline everywhere the heuristic decided freely
        assert advice[("inline", False, "policy")] > 0
        assert not any(a == "dont_inline" for a, _, _ in advice)
        return
    # both answers occur, and both change the heuristic's decision somewhere
    assert advice[("inline", False, "policy")] > 0
    assert advice[("dont_inline", False, "policy")] > 0


def test_always_inline_in_the_compiler_answers_as_on_the_channel(compiler, tmp_path):
    """always-inline compiles with its constant policy file in the compiler (seconds) instead
    of the channel (minutes on larger programs): the same dumps and the same binaries."""
    spec = parse_policy("always-inline")
    data = compiler_policy_file(spec)
    assert data is not None and spec.identity() == "always-inline"
    path = tmp_path / "always.policy"
    path.write_bytes(data)
    decoded = read_policy_file(path)
    assert decoded.classes == ["inline"] and decoded.margin == 0.0 and not decoded.ranges \
        and decoded.growth_budget is None
    inlined = 0
    for bench in ("kahan", "sieve"):
        in_compiler = _build(compiler, bench, tmp_path / bench / "file",
                             PolicyFile(path, spec.identity()))
        with PolicyHost(AlwaysInlinePolicy()) as host:
            hosted = _build(compiler, bench, tmp_path / bench / "host",
                            PolicyChannel(host.base, spec.identity()))
        assert not host.errors and in_compiler == hosted, bench
        inlined += sum(d.advice == "inline" and d.heuristic != "inline"
                       for name in in_compiler if name != "binary"
                       for d in read_dump(tmp_path / bench / "file" / name).decisions)
    assert inlined > 0  # it departs from the heuristic somewhere
    assert compiler_policy_file(parse_policy("never-inline")) is None  # on the channel


def _check_the_budget_binds(policy: TrainedPolicy, tmp_path: Path) -> None:
    """In the compiler's dumps: what the inline answers that depart from the heuristic add to
    each (unit, round, function) stays within the budget, and somewhere the budget turned
    such an answer into default (the model's own answer, guard rails but the budget applied,
    is inline at a site whose advice is default)."""
    assert policy.growth_budget == SMALL_BUDGET
    spent: Counter = Counter()
    bound = discounted = 0
    for path in sorted(tmp_path.glob("*/file/*.decisions.sexp")):
        for d in read_dump(path).decisions:
            if d.advice is None or d.features is None or d.heuristic == "inline":
                continue
            row = d.features.row()
            if d.advice == "inline":
                grows = growth(row, policy.growth_discount)
                spent[(path.parent.parent.name, path.name, function_of_key(d.key))] += grows
                discounted += grows < row["callee_size"]
            elif d.advice == "default" and d.reason == "heuristic" \
                    and policy.advise(row, d.heuristic, "heuristic") == "inline":
                bound += 1
    print(f"budget {SMALL_BUDGET}: {bound} inline answers made default; most spent "
          f"{max(spent.values(), default=0)}; {discounted} departures discounted")
    assert spent and max(spent.values()) <= SMALL_BUDGET
    assert bound > 0
    assert (discounted > 0) == bool(policy.growth_discount)  # format 2: the discount was used


def test_the_guard_rails_keep_the_heuristic_more_often(compiler, policies, tmp_path):
    """The same model with and without its guard rails, on benchmarks never seen: with them,
    fewer sites deviate from the heuristic."""
    deviating: Counter = Counter()
    for which in ("boosted", "boosted-bare"):
        for bench in OTHERS:
            built = build_benchmark(resolve_benchmark(bench), tmp_path / which / bench,
                                    compiler.ocamlopt, dump_decisions=True,
                                    policy=PolicyFile(policies[which], which))
            deviating[which] += sum(d.advice not in (None, "default")
                                    and d.advice != d.heuristic
                                    for p in built.decision_files
                                    for d in read_dump(p).decisions)
    print(dict(deviating))
    assert 0 < deviating["boosted"] < deviating["boosted-bare"], deviating


def _compile(compiler, workdir: Path, *options: str, env=None):
    (workdir / "main.ml").write_text("let f x = x + 1\nlet () = print_int (f 2)\n")
    # TMPDIR: the compiler's temporary .s, which a refused policy leaves, stays in workdir
    return subprocess.run([str(compiler.ocamlopt), "-O3", *options, "-c", "main.ml"],
                          cwd=workdir, capture_output=True, text=True, timeout=120,
                          env={**(os.environ if env is None else env), "TMPDIR": str(workdir)})


def test_a_bad_policy_file_is_one_line_from_the_compiler(compiler, policies, tmp_path):
    good = policies["boosted"].read_text()
    cases = [
        (good.replace("(version 1)", "(version 7)"),
         "policy format version atom 7; this compiler reads 1 or 2"),
        (good.replace("(leaf ", "(leaf x", 1), "leaf: expected a finite number, got atom x"),
        (good.replace("(margin 0.2)", "(margin nan)"),
         "margin: expected a finite number, got atom nan"),
        (good[:-3], "unclosed '(': expected ')' before the end of the file"),
        (good.replace("(classes ", "(classes maybe "),
         "classes: expected distinct labels among inline, dont_inline, default"),
        ("(inlining_overrides (version 1) (overrides))",
         "expected (inlining_policy (version 1|2) ...), got a list"),
    ]
    bad = tmp_path / "bad.policy"
    for text, message in cases:
        bad.write_text(text)
        proc = _compile(compiler, tmp_path, "-inlining-policy", str(bad))
        assert proc.returncode == 2 and proc.stdout == ""
        (line,) = proc.stderr.splitlines()
        assert line.startswith(f"{bad}:") and message in line, line
    bad.write_bytes(pickle.dumps({"format": "inlining-policy"}, protocol=4))
    proc = _compile(compiler, tmp_path, "-inlining-policy", str(bad))
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"{bad}: a pickled policy from an older version; retrain it with train-policy"]
    proc = _compile(compiler, tmp_path, "-inlining-policy", str(tmp_path / "none.policy"))
    assert proc.returncode == 2 and proc.stderr.startswith(
        f"{tmp_path / 'none.policy'}: cannot read the inlining policy file (")
    proc = _compile(compiler, tmp_path, "-inlining-policy", str(policies["boosted"]),
                    "-inlining-policy-channel", str(tmp_path / "chan"))
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1
    assert "give one of them, not both" in proc.stderr


def test_a_build_the_compiler_refuses_leaves_no_temporary_file(compiler, policies, tmp_path,
                                                               monkeypatch):
    """The compiler exits on a refused policy without removing its temporary .s: one empty
    file per compile, which a campaign's /tmp would collect; the build's own TMPDIR, removed
    after each compile, keeps the caller's clean."""
    from dispatcher.build.driver import BuildError
    caller_tmp = tmp_path / "tmp"
    caller_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(caller_tmp))
    bad = tmp_path / "bad.policy"
    bad.write_text(policies["boosted"].read_text().replace("(version 1)", "(version 7)"))
    with pytest.raises(BuildError, match="policy format version"):
        build_benchmark(resolve_benchmark("kahan"), tmp_path / "b",
                        compiler.ocamlopt, policy=PolicyFile(bad, "bad"))
    assert list(caller_tmp.iterdir()) == []


def test_a_policy_file_through_ocamlparam(compiler, policies, tmp_path):
    """``OCAMLPARAM`` ``inlining-policy=FILE`` as the option does: the dump records the
    policy's advice."""
    env = dict(os.environ, OCAMLPARAM=f"_,dump-inlining-decisions=1,"
                                      f"inlining-policy={policies['constant']}")
    proc = _compile(compiler, tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    decisions = read_dump(tmp_path / "main.0.decisions.sexp").decisions
    assert decisions and all(d.advice is not None for d in decisions)


def test_the_compile_service_gives_a_policy_file_to_the_compiler(compiler, policies, tmp_path):
    """A ``.policy`` named as a compile's policy is evaluated by the compiler (no host): the
    build is the one ``-inlining-policy`` makes, keyed by the file's content, so the same file
    again is a cache hit and a different file (another margin) is another build."""
    from dispatcher.build.policies import parse_policy
    from dispatcher.build.service import CompileJob, CompileService
    from dispatcher.storage.store import Store
    bench = resolve_benchmark("sieve")
    direct = _build(compiler, "sieve", tmp_path / "direct",
                    PolicyFile(policies["boosted"], "x"))
    service = CompileService(Store(tmp_path / "store"), compiler)
    try:
        spec = parse_policy(str(policies["boosted"]))
        built = service.compile(CompileJob(bench, policy=spec))
        output = built.artifact.compiler_output
        assert not built.cached and "-inlining-policy " in output \
            and "-inlining-policy-channel" not in output
        assert built.artifact.binary.read_bytes() == direct["binary"]
        assert {n: t.encode() for n, t in built.artifact.decision_texts().items()} == \
            {n: t for n, t in direct.items() if n != "binary"}
        assert service.compile(CompileJob(bench, policy=parse_policy(
            str(policies["boosted"])))).cached
        bare = service.compile(CompileJob(bench, policy=parse_policy(
            str(policies["boosted-bare"]))))
        assert not bare.cached and bare.artifact.key != built.artifact.key
    finally:
        service.close()


def test_the_function_a_key_is_in():
    """The growth budget's function: the key up to its last D(...) frame, or the top level."""
    f = "D(Lu.decompose@lu.ml:6:14-759)"
    assert function_of_key(f"{f}/C(Matrix.copy@lu.ml:8:10-23)") == f
    assert function_of_key(f"{f}/C(Matrix.update@lu.ml:26:8-67)/I/C(Lu.anon_fn[lu.ml:26,"
                           "28--67]@matrix.ml:8:31-46)#1") == f
    inner = f"{f}/D(Lu.anon_fn[lu.ml:26,28--67]@lu.ml:26:28-67)"
    assert function_of_key(f"{inner}/C(Matrix.get@lu.ml:26:49-65)") == inner
    assert function_of_key("D(A.f@src/a.ml:1:0-9)/C(B.g@src/a.ml:2:0-5)") \
        == "D(A.f@src/a.ml:1:0-9)"
    assert function_of_key("C(Stdlib.print_int@main.ml:3:9-20)") == ""


def _inline_everywhere(budget):
    return TrainedPolicy(classifier="constant", classes=["inline"], model=Constant("inline"),
                         columns=[], threshold=0.0, benchmarks=["x"], growth_budget=budget)


def test_the_growth_budget_in_python():
    """Inline answers where the heuristic did not inline spend callee_size from their
    function's budget in their round and unit; beyond it, default; the heuristic's own
    inline spends nothing; another function, round or unit has its own budget."""
    e = PolicyEvaluation(_inline_everywhere(30))
    f, g = "D(A.f@a.ml:1:0-99)", "D(A.g@a.ml:5:0-99)"

    def ask(key, size, heuristic="dont_inline", unit="A", round=0):
        return e.advise(unit, round, key, {"callee_size": size}, heuristic, "heuristic")

    assert ask(f"{f}/C(B.h@a.ml:2:0-5)", 12) == "inline"
    assert ask(f"{f}/C(B.h@a.ml:2:0-5)/I/C(B.k@b.ml:1:0-5)", 12) == "inline"  # 24 spent
    assert ask(f"{f}/C(B.h@a.ml:3:0-5)", 20, "inline") == "inline"  # the heuristic's own
    assert ask(f"{f}/C(B.h@a.ml:4:0-5)", 12) == "default"  # 36 > 30
    assert ask(f"{f}/C(B.h@a.ml:4:0-5)", 6, "specialise") == "inline"  # 30: still within
    assert ask(f"{f}/C(B.h@a.ml:4:0-5)", 1) == "default"
    assert ask(f"{g}/C(B.h@a.ml:6:0-5)", 30) == "inline"  # another function
    assert ask(f"{g}/C(B.h@a.ml:6:0-5)", 31, round=1) == "default"  # above the budget alone
    assert ask(f"{g}/C(B.h@a.ml:6:0-5)", 30, round=1) == "inline"  # another round
    assert ask("C(B.h@a.ml:9:0-5)", 30) == "inline"  # the top level
    assert ask("C(B.h@a.ml:9:0-5)", 1) == "default"
    assert ask(f"{f}/C(B.h@a.ml:4:0-5)", 12, unit="B") == "inline"  # another unit: afresh
    assert ask(f"{f}/C(B.h@a.ml:4:0-5)", 12, unit="A") == "inline"  # and A again, afresh
    e.start_unit("A")
    assert ask(f"{f}/C(B.h@a.ml:4:0-5)", 30) == "inline"
    unlimited = PolicyEvaluation(_inline_everywhere(None))
    assert all(unlimited.advise("A", 0, f"{f}/C(B.h@a.ml:2:0-5)", {"callee_size": 500},
                                "dont_inline", "heuristic") == "inline" for _ in range(5))


def test_the_host_starts_each_session_afresh():
    """The policy host's LearnedPolicy: a session's first observation (seq 0) starts the
    budget afresh, even for the same unit compiled again."""
    from dispatcher.build.policies import Advice, Observation
    from dispatcher.core.decisions import parse_features_text
    policy = LearnedPolicy(PolicySpec("learned", trained=_inline_everywhere(30)))

    def observe(seq):
        return policy.decide(Observation(
            seq=seq, unit="A", round=0, key="D(A.f@a.ml:1:0-9)/C(B.g@a.ml:2:0-5)",
            callee="B.g", heuristic_action="dont_inline", heuristic_reason="heuristic",
            heuristic_guard=None, heuristic_detail="above_threshold",
            features=parse_features_text(
                " (round 0) (depth 0) (args 1) (known_args 0) (callee_size 20) (toplevel false)"
                " (branch_depth 0) (recursive false) (self_call false) (in_loop false)"
                " (in_recursive_function false) (via_stub false) (inline_attribute default)"
                " (inlined_attribute default) (specialise_attribute default)"
                " (specialised_attribute default)", "test")))

    assert [observe(0), observe(1)] == [Advice.INLINE, Advice.DEFAULT]
    assert observe(0) == Advice.INLINE


def test_the_growth_budget_in_the_file(tmp_path):
    """Written and read back (an integer or none); anything else is one line."""
    for budget in (30, None):
        save_policy_file(_inline_everywhere(budget), tmp_path / "p.policy")
        assert read_policy_file(tmp_path / "p.policy").growth_budget == budget
    text = policy_text(_inline_everywhere(30))
    assert "(growth_budget 30)" in text
    for bad in ("0", "-3", "1.5", '"30"', "1000000000"):
        with pytest.raises(PolicyFileError) as err:
            decode_policy_file(text.replace("(growth_budget 30)", f"(growth_budget {bad})")
                               .encode(), "p.policy")
        assert "growth_budget: expected none or an integer from 1 to 999999999" \
            in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(PolicyFileError, match="guards: missing \\(growth_budget"):
        decode_policy_file(text.replace(" (growth_budget 30)", "").encode(), "p.policy")


def test_the_growth_discount_in_python_and_in_the_file(tmp_path):
    """Format version 2: a departure spends callee_size / (1 + sum of weight x feature), the
    feature 0 where absent or negative, a boolean 1 or 0; written as version 2 only where
    there is a discount, read back as written; a bad discount is one line naming it."""
    policy = dataclasses.replace(_inline_everywhere(30), growth_discount=(
        ("direct_call_of_indirect", 1.0), ("in_loop", 0.5)))
    assert growth({"callee_size": 30}, policy.growth_discount) == 30.0
    assert growth({"callee_size": 30, "direct_call_of_indirect": 2, "in_loop": True},
                  policy.growth_discount) == 30.0 / 3.5
    assert growth({"callee_size": 30, "direct_call_of_indirect": -4, "in_loop": False},
                  policy.growth_discount) == 30.0
    e = PolicyEvaluation(policy)
    f = "D(A.f@a.ml:1:0-99)"
    site = {"callee_size": 40, "direct_call_of_indirect": 3}  # 40 / 4 = 10
    assert [e.advise("A", 0, f"{f}/C(B.h@a.ml:{i}:0-5)", site, "dont_inline")
            for i in range(4)] == ["inline", "inline", "inline", "default"]
    text = policy_text(policy)
    assert "(version 2)" in text and \
        '(growth_discount ("direct_call_of_indirect" 1.0) ("in_loop" 0.5))' in text
    save_policy_file(policy, tmp_path / "p.policy")
    assert read_policy_file(tmp_path / "p.policy") == policy
    assert "(version 1)" in policy_text(_inline_everywhere(30))
    for bad, why in (('("nope" 1.0)', '"nope" is not a number feature of the compiler'),
                     ('("inline_attribute" 1.0)', "not a number feature"),
                     ('("in_loop" -1)', "expected a weight from 0 to 1000, got atom -1"),
                     ('("in_loop" 1001)', "expected a weight from 0 to 1000"),
                     ('("in_loop" x)', "growth_discount weight: expected a finite number"),
                     ('("in_loop" 1) ("in_loop" 2)', '"in_loop" twice'),
                     ("(in_loop 1)", 'expected ("FEATURE" WEIGHT)'),
                     ("in_loop", 'expected ("FEATURE" WEIGHT)')):
        mutated = re.sub(r"\(growth_discount [^\n]*\)\)\)", f"(growth_discount {bad}))",
                         text, count=1)
        assert mutated != text
        with pytest.raises(PolicyFileError) as err:
            decode_policy_file(mutated.encode(), "p.policy")
        assert why in str(err.value) and "\n" not in str(err.value), bad
    with pytest.raises(PolicyFileError, match="guards: missing \\(growth_discount"):
        decode_policy_file(re.sub(r" \(growth_discount [^\n]*\)\)\)", ")", text,
                                  count=1).encode(), "p.policy")
    with pytest.raises(PolicyFileError, match="guards: expected one of"):  # not in version 1
        decode_policy_file(text.replace("(version 2)", "(version 1)").encode(), "p.policy")
    with pytest.raises(ExportError, match="growth discount 'nope'"):
        policy_text(dataclasses.replace(policy, growth_discount=(("nope", 1.0),)))


# -- lu as a lesson (docs/policies.md, "lu: one answer that costs everything") ----------------

UPDATE_KEY = "D(Lu.decompose@lu.ml:6:14-759)/C(Matrix.update@lu.ml:26:8-67)"


def _dont_inline_at_update(hot: float, low: float = 0.0, high: float = 1000.0):
    """A tree over callee_size that answers dont_inline with log-odds ``hot`` at a callee of
    Matrix.update's size (24) and is indifferent elsewhere (a tie: dont_inline at
    probability 0.5, which the margin turns into default where the heuristic inlines)."""
    tree = Tree(0, [Node(0, 23.5, 1, 2), Node(-1, value=0.0), Node(0, 24.5, 3, 4),
                    Node(-1, value=hot), Node(-1, value=0.0)])
    return TrainedPolicy(classifier="boosted", classes=["dont_inline", "inline"],
                         model=Trees([0.0], [tree]), columns=[Column("callee_size", low, high)],
                         threshold=0.0, benchmarks=["x"])


def test_the_guard_rails_at_lus_hot_site(compiler, tmp_path):
    """A policy answering dont_inline at lu's Matrix.update call in Lu.decompose (where the
    heuristic inlines it in round 1, which makes the closure a known function, inlined with
    unboxed floats): compiled in the compiler, the dump shows which guard keeps the
    heuristic's inline.  An unsure answer: the margin; a site outside the training ranges:
    the ranges; a confident answer in range: none of them (the growth budget bounds inline
    answers only), so the policy's dont_inline is what compiles, and only the measured
    validation gate can catch it."""
    variants = {"unsure": (_dont_inline_at_update(-0.2), "default", "inline"),
                "out of range": (_dont_inline_at_update(-5.0, high=20.0), "default", "inline"),
                "confident": (_dont_inline_at_update(-5.0), "dont_inline", "dont_inline")}
    for name, (policy, advice, action) in variants.items():
        path = tmp_path / f"{name.replace(' ', '-')}.policy"
        save_policy_file(policy, path)
        built = build_benchmark(resolve_benchmark("lu"), tmp_path / path.stem,
                                compiler.ocamlopt, dump_decisions=True,
                                policy=PolicyFile(path, name))
        (dump,) = [p for p in built.decision_files if p.name == "lu.1.decisions.sexp"]
        (site,) = [d for d in read_dump(dump).decisions if d.key == UPDATE_KEY]
        assert (site.heuristic, site.advice, site.action) == ("inline", advice, action), name
        assert site.reason == ("policy" if advice == "dont_inline" else "heuristic"), name
