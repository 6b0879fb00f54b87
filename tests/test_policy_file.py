"""Policy files are data, evaluated alike by our Python evaluator and by the compiler.

Policies trained on real features (the heuristic builds' dumps of bundled benchmarks) with a
planted labelling rule: the exported evaluator reproduces scikit-learn's ``predict`` on every
training row (only exact near-ties may differ, and they are reported); then, with the real
compiler, ``ocamlopt -inlining-policy FILE`` answers every decision as the Python host
serving the same file does (same dumps, advice included, and the same binaries, over several
bundled programs), with both ``inline`` and ``dont_inline`` answers changing the heuristic's
decisions; a malformed or pickled file is one line from the compiler."""
from __future__ import annotations

import hashlib
import os
import pickle
import subprocess
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from analysis.policy_training import KEY, encode, fit_model, train
from dispatcher.build.driver import PolicyChannel, PolicyFile, build_benchmark
from dispatcher.build.manifest import resolve_benchmark
from dispatcher.build.policies import LearnedPolicy, PolicySpec
from dispatcher.build.policy_file import answer, read_policy_file, save_policy_file
from dispatcher.build.policy_host import PolicyHost
from dispatcher.core.decisions import read_dump

TRAINING = ("kahan", "hamming", "bdd", "lens")
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
def sites(compiler, tmp_path_factory):
    """The training table: every decision the heuristic took freely in the training
    benchmarks' builds, with its features and a planted label."""
    tmp = tmp_path_factory.mktemp("policy-file")
    rows = []
    for name in TRAINING:
        built = build_benchmark(resolve_benchmark(name), tmp / name, compiler.ocamlopt,
                                dump_decisions=True)
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
    for name, kwargs in (("boosted", {}), ("logistic", {}), ("mlp", {}),
                         ("boosted-bare", {"margin": 0.0, "ranges": False})):
        path = tmp / f"{name}.policy"
        save_policy_file(train(sites, name.split("-")[0], 0.0, **kwargs), path)
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


@pytest.mark.parametrize("which", ["boosted", "logistic", "mlp", "boosted-bare", "constant"])
def test_the_compiler_answers_as_the_python_host(compiler, policies, which, tmp_path):
    """For the same file, the compiler's own evaluation and the Python host's answer every
    decision alike: identical dumps (each decision's advice and the heuristic's action) and
    identical binaries, on training benchmarks and on benchmarks never seen."""
    path = policies[which]
    data = path.read_bytes()
    spec = PolicySpec("learned", source=str(path), digest=hashlib.sha256(data).hexdigest(),
                      trained=read_policy_file(path), data=data)
    advice: Counter = Counter()
    for bench in (*TRAINING[:2], *OTHERS):
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
    asked = sum(advice.values())
    assert asked > 200
    if which == "constant":  # inline everywhere the heuristic decided freely
        assert advice[("inline", False, "policy")] > 0
        assert not any(a == "dont_inline" for a, _, _ in advice)
        return
    # both answers occur, and both change the heuristic's decision somewhere
    assert advice[("inline", False, "policy")] > 0
    assert advice[("dont_inline", False, "policy")] > 0


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
    return subprocess.run([str(compiler.ocamlopt), "-O3", *options, "-c", "main.ml"],
                          cwd=workdir, capture_output=True, text=True, timeout=120, env=env)


def test_a_bad_policy_file_is_one_line_from_the_compiler(compiler, policies, tmp_path):
    good = policies["boosted"].read_text()
    cases = [
        (good.replace("(version 1)", "(version 7)"),
         "policy format version atom 7; this compiler reads 1"),
        (good.replace("(leaf ", "(leaf x", 1), "leaf: expected a finite number, got atom x"),
        (good.replace("(margin 0.2)", "(margin nan)"),
         "margin: expected a finite number, got atom nan"),
        (good[:-3], "unclosed '(': expected ')' before the end of the file"),
        (good.replace("(classes ", "(classes maybe "),
         "classes: expected distinct labels among inline, dont_inline, default"),
        ("(inlining_overrides (version 1) (overrides))",
         "expected (inlining_policy (version 1) ...), got a list"),
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
