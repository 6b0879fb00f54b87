"""Policies end to end (issue 15): searches on two small benchmarks -> rewards -> train-policy
(features from the compiler's dumps) -> run-plugin-benchmark on a third benchmark the policy
never saw, its build answered by the policy through the compiler's channel; and the bad inputs
of both commands, one line each."""
from __future__ import annotations

import csv
import json
import shutil

import pytest
import yaml

from tests.helpers import GOLDEN, tiny_search_config
from tests.helpers import cli as _cli


@pytest.fixture(scope="module")
def trained(tmp_path_factory, compiler):
    """Two tiny searches, their rewards and a logistic policy trained on them."""
    tmp = tmp_path_factory.mktemp("plugin")
    bench = tmp / "tinysum"
    shutil.copytree(GOLDEN / "tinysum", bench)
    # searched at the tiny size (kahan's quick runs took 7 of this fixture's 25 CPU-s): the
    # golden program's copy gets one, its quick size
    manifest = yaml.safe_load((bench / "benchmark.yaml").read_text())
    manifest["sizes"]["tiny"] = manifest["sizes"]["quick"]
    (bench / "benchmark.yaml").write_text(yaml.safe_dump(manifest))
    cfg = tiny_search_config(tmp)
    (tmp / "tasks").write_text(f"{bench}\nkahan\n")
    run = _cli("run_training_experiments", "--config", str(cfg), "--tasks", str(tmp / "tasks"),
               "--steps", "6", "--size", "tiny", cwd=tmp)
    assert run.returncode == 0, run.stderr
    for experiment in (tmp / "rundirs").glob("*/experiment.json"):  # what a resume checks
        assert json.loads(experiment.read_text())["compiler"] == compiler.identity
    rewards = _cli("assign-rewards", "--batch-log", str(tmp / "batch.log"), "--out",
                   str(tmp / "rewards"), "--model", "ridge", "--gamma", "0.8", "--alpha", "0.01",
                   "--target", "log", "--bootstrap", "10", cwd=tmp)
    assert rewards.returncode == 0, rewards.stderr
    policy = tmp / "mine.policy"
    train = _cli("train-policy", "--rewards", str(tmp / "rewards"), "--config", str(cfg),
                 "--threshold", "0", "--classifier", "logistic", "--out", str(policy), cwd=tmp)
    assert train.returncode == 0, train.stderr
    return tmp, cfg, policy, train


def test_train_policy_validates_on_the_benchmark_left_out(trained):
    tmp, _, policy, train = trained
    assert policy.is_file()
    assert "held out one benchmark at a time" in train.stdout
    assert train.stdout.strip().splitlines()[-1] == (
        f"logistic trained on kahan, tinysum: {policy}")
    with open(policy.with_name("mine.policy.scores.csv")) as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["held_out"] for r in rows) == ["kahan", "tinysum"]
    assert all(0 <= float(r["accuracy"]) <= 1 and int(r["sites"]) > 0 for r in rows)


def test_run_plugin_benchmark_measures_an_unseen_benchmark_under_the_policy(trained):
    tmp, cfg, policy, _ = trained
    r = _cli("run-plugin-benchmark", str(policy), "sieve", "--config", str(cfg), "--runs", "2",
             "--max-pairs", "2", "--results", str(tmp / "results"), cwd=tmp)
    assert r.returncode == 0, r.stderr
    out = tmp / "results" / "sieve" / "plugins" / "plugin_mine.csv"
    with open(out) as f:
        rows = list(csv.reader(f))
    assert rows[0][:3] == ["worker", "overrides", "rundirs"]
    assert [row[1] for row in rows[1:]] == [str(policy.resolve()), "heuristic"]
    assert all(float(t) > 0 for row in rows[1:] for t in row[3:] if t)
    lines = r.stdout.splitlines()
    (row,) = [line for line in lines if line.startswith("sieve ")]
    assert row.split()[1] == "test"
    assert any(line.startswith("test: geometric mean speedup ") and "over 1 benchmark" in line
               for line in lines), r.stdout
    # the build was answered by the policy (its identity is in the compile's record)
    metas = [json.loads(p.read_text()) for p in (tmp / "store" / "compiled").rglob("meta.json")]
    assert any(m.get("policy", "").startswith("learned:sha256:") and m["benchmark"] == "sieve"
               for m in metas)


def test_bad_inputs_are_one_line(trained):
    tmp, cfg, policy, _ = trained
    cases = [
        (("run-plugin-benchmark", "nope.policy", "sieve"),
         "run-plugin-benchmark: policy nope.policy: cannot read"),
        (("run-plugin-benchmark", str(tmp / "tasks"), "sieve"),
         "run-plugin-benchmark: policy "),
        (("run-plugin-benchmark", "heuristic", "no-such-bench"),
         "run-plugin-benchmark: "),
        (("train-policy", "--rewards", str(tmp / "nowhere")),
         f"train-policy: {tmp / 'nowhere'}: no such rewards directory"),
        (("train-policy", "--rewards", str(tmp / "rewards"), "lens"),
         "train-policy: unknown benchmark lens"),
        (("train-policy", "--rewards", str(tmp / "rewards"), "--classifier", "logistic",
          "--out", "/proc/nowhere/p.policy"),
         "train-policy: /proc/nowhere/p.policy: cannot write the policy"),
    ]
    for args, start in cases:
        r = _cli(*args, "--config", str(cfg), cwd=tmp)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        line = r.stderr.strip()
        assert "\n" not in line and "Traceback" not in line and line.startswith(start), \
            (args, line)
