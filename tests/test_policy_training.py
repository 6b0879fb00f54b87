"""Policy training (analysis.policy_training) on synthetic data with a planted rule: the
labels follow the threshold, every classifier learns the rule across benchmarks, a saved
policy (dispatcher.build.policy_file) loads back and answers the same; a file that is not a
policy is one line."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.policy_training import (
    CLASSIFIERS,
    TrainingError,
    label,
    leave_one_benchmark_out,
    summary,
    train,
    training_set,
)
from dispatcher.build.policy_file import PolicyFileError, read_policy_file, save_policy_file


def test_labels_follow_the_threshold():
    assert [label(x, 0.01) for x in (0.02, -0.02, 0.005, -0.01, float("nan"))] == \
        ["inline", "dont_inline", "default", "default", "default"]


def planted(seed: int = 0, benches=("a", "b", "c"), n: int = 120):
    """Sites whose net reward is planted: small callees (size < 20) gain from inlining,
    large ones lose, a few in between do not matter; ``noise`` carries nothing."""
    rng = np.random.default_rng(seed)
    rewards, features = {}, {}
    for b in benches:
        size = rng.integers(1, 60, n)
        net = np.where(size < 20, 0.05, np.where(size > 30, -0.05, 0.0))
        keys = [f"C(M.f{i}@m.ml:{i}:0-1)" for i in range(n)]
        rewards[b] = pd.DataFrame({"unit": "Main", "round": 0, "key": keys, "kind": "call",
                                   "net": net})
        features[b] = pd.DataFrame({"unit": "Main", "round": 0, "key": keys, "size": size,
                                    "noise": rng.normal(size=n),
                                    "is_stub": rng.integers(0, 2, n).astype(bool),
                                    "attribute": rng.choice(["default", "always"], n)})
    return rewards, features


def test_a_planted_rule_is_learned_on_benchmarks_left_out():
    ts = training_set(*planted(), threshold=0.01)
    assert set(ts.labels) == {"inline", "dont_inline", "default"}
    assert ts.columns == ["size", "noise", "is_stub", "attribute=always",
                          "attribute=default"]
    for name in CLASSIFIERS:
        scores = leave_one_benchmark_out(ts, name)
        assert list(scores["held_out"]) == ["a", "b", "c"]
        assert scores["accuracy"].min() > 0.8, (name, scores)
        assert scores["opposite"].max() < 0.05, (name, scores)
    assert list(summary(leave_one_benchmark_out(ts, "boosted"))["classifier"]) == ["boosted"]


def test_a_saved_policy_answers_as_trained(tmp_path):
    ts = training_set(*planted(), threshold=0.01)
    policy = train(ts, "boosted", 0.01)
    save_policy_file(policy, tmp_path / "p.policy")
    back = read_policy_file(tmp_path / "p.policy")
    assert back.columns == policy.columns and back.benchmarks == ["a", "b", "c"]
    assert back.advise({"size": 5, "noise": 0.3, "is_stub": False,
                        "attribute": "always"}) == "inline"
    assert back.advise({"size": 5, "noise": 0.3, "is_stub": False,
                        "attribute": "never seen"}) == "inline"
    assert back.advise({"size": 50, "noise": 0.3, "is_stub": True}) == "dont_inline"
    assert back.advise({"size": 5}) == "inline"  # an absent feature is -1, as in training


def test_bad_policy_files_and_data_are_one_line(tmp_path):
    (tmp_path / "x.policy").write_text("not a pickle")
    with pytest.raises(PolicyFileError, match=r"x.policy: not a policy file"):
        read_policy_file(tmp_path / "x.policy")
    with pytest.raises(PolicyFileError, match=r"nope.policy: no such policy file"):
        read_policy_file(tmp_path / "nope.policy")
    rewards, features = planted(benches=("a",))
    with pytest.raises(TrainingError, match=r"^b: no features"):
        training_set({**rewards, "b": rewards["a"]}, features, 0.01)
    features["a"]["key"] = "other"
    with pytest.raises(TrainingError, match="no call site has both a reward and features"):
        training_set(rewards, features, 0.01)


def test_a_policy_file_is_read_once_and_answers_through_its_spec(tmp_path, monkeypatch):
    """From ``run-plugin-benchmark POLICY`` to the compiler a .policy file is read once, when
    it is named: the spec carries what it held (hashed from the same bytes) to the policy
    object each compile makes.  A policy file with a one-label model written before the
    format moved to dispatcher (naming analysis.policy_training._Constant) still reads."""
    import hashlib

    import joblib

    import dispatcher.build.policies as policies
    from dispatcher.build.policy_file import ConstantModel
    path = tmp_path / "p.policy"
    save_policy_file(train(training_set(*planted(), threshold=0.01), "logistic", 0.01), path)
    reads = []
    real = policies.decode_policy_file
    monkeypatch.setattr(policies, "decode_policy_file",
                        lambda data, where: reads.append(where) or real(data, where))
    spec = policies.parse_policy(str(path))
    assert reads == [str(path.resolve())]
    assert spec.digest == hashlib.sha256(path.read_bytes()).hexdigest()
    again = policies.parse_policy(str(path))
    assert spec == again and hash(spec) == hash(again) and spec.identity() == again.identity()
    first, second = policies.policy_of_spec(spec), policies.policy_of_spec(spec)
    assert len(reads) == 2 and first.trained is second.trained is spec.trained

    class Site:  # what decide reads of an observation
        heuristic_reason = "heuristic"

        class features:
            @staticmethod
            def row():
                return {"size": 5, "noise": 0.3, "is_stub": False, "attribute": "always"}
    assert first.decide(Site()) is policies.Advice.INLINE  # type: ignore[arg-type]
    old = tmp_path / "old.policy"  # protocol 2 names a class in one text line
    joblib.dump({"format": "inlining-policy", "version": 1, "classifier": "logistic",
                 "model": ConstantModel("inline"), "columns": ["size"], "threshold": 0.01,
                 "benchmarks": ["a"]}, old, protocol=2)
    new_name = b"dispatcher.build.policy_file\nConstantModel\n"
    assert new_name in old.read_bytes()
    old.write_bytes(old.read_bytes().replace(new_name,
                                             b"analysis.policy_training\n_Constant\n"))
    assert read_policy_file(old).advise({"size": 3}) == "inline"


def test_balanced_accuracy_of_a_held_out_benchmark_warns_nothing():
    """A benchmark left out often lacks a label the model predicts; scikit-learn warns about
    it on stderr, which broke train-policy's one-line output (seen in CI)."""
    import warnings

    import numpy as np

    from analysis.policy_training import _balanced_accuracy
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = _balanced_accuracy(np.array(["inline", "default"]),
                                 np.array(["inline", "dont_inline"]))
    assert 0.0 <= got <= 1.0
    assert _balanced_accuracy(np.array(["inline"] * 2), np.array(["inline", "default"])) == 0.5
