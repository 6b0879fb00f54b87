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
    """Sites whose net reward is planted: small callees (callee_size < 20) gain from inlining,
    large ones lose, a few in between do not matter; ``evaluated_benefit`` is noise, carrying
    nothing (features named as the compiler's: a policy file's columns must name them)."""
    rng = np.random.default_rng(seed)
    rewards, features = {}, {}
    for b in benches:
        size = rng.integers(1, 60, n)
        net = np.where(size < 20, 0.05, np.where(size > 30, -0.05, 0.0))
        keys = [f"C(M.f{i}@m.ml:{i}:0-1)" for i in range(n)]
        rewards[b] = pd.DataFrame({"unit": "Main", "round": 0, "key": keys, "kind": "call",
                                   "net": net})
        features[b] = pd.DataFrame({"unit": "Main", "round": 0, "key": keys,
                                    "callee_size": size,
                                    "evaluated_benefit": rng.normal(size=n),
                                    "via_stub": rng.integers(0, 2, n).astype(bool),
                                    "inline_attribute": rng.choice(["default", "always"], n)})
    return rewards, features


def test_a_planted_rule_is_learned_on_benchmarks_left_out():
    ts = training_set(*planted(), threshold=0.01)
    assert set(ts.labels) == {"inline", "dont_inline", "default"}
    assert ts.columns == ["callee_size", "evaluated_benefit", "via_stub",
                          "inline_attribute=always", "inline_attribute=default"]
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
    assert back.predict({"callee_size": 5, "evaluated_benefit": 0.3, "via_stub": False,
                         "inline_attribute": "always"}) == "inline"
    assert back.predict({"callee_size": 5, "evaluated_benefit": 0.3, "via_stub": False,
                         "inline_attribute": "never seen"}) == "inline"
    assert back.predict({"callee_size": 50, "evaluated_benefit": 0.3,
                         "via_stub": True}) == "dont_inline"
    assert back.predict({"callee_size": 5}) == "inline"  # an absent feature is -1, as in training
    # the guard rails: a text value never seen, or a number outside its training range
    # (via_stub absent: -1), is out of range and gets default
    site = {"callee_size": 5, "evaluated_benefit": 0.3, "via_stub": False,
            "inline_attribute": "always"}
    assert back.advise(site, "dont_inline") == "inline"
    assert back.advise({**site, "inline_attribute": "never seen"}, "dont_inline") == "default"
    assert back.advise({"callee_size": 5}, "dont_inline") == "default"
    assert back.advise({**site, "callee_size": 500}, "dont_inline") == "default"
    assert back.advise(site, "dont_inline", "attribute") == "default"


def test_the_margin_guard_rail(tmp_path):
    """The model's answer overrules the heuristic's action only where its probability beats
    that of the heuristic's action's class by the margin; the same answer, or default, is
    always taken."""
    from dispatcher.build.policy_file import answer, encode_row
    ts = training_set(*planted(), threshold=0.01)
    loose = train(ts, "logistic", 0.01, margin=0.0)
    # a site near the boundary, where the model is not sure of its answer
    for size in range(1, 60):
        site = {"callee_size": size, "evaluated_benefit": 0.0, "via_stub": False,
                "inline_attribute": "default"}
        a, probs = answer(loose.classes, loose.model_scores(encode_row(loose.column_names,
                                                                       site)))
        p = dict(zip(loose.classes, probs))
        other = "inline" if a == "dont_inline" else "dont_inline"
        if a != "default" and 0.05 < p[a] - p[other] < 0.95:
            break
    else:
        pytest.fail("no site with an uncertain answer")
    gap = p[a] - p[other]
    assert loose.advise(site, other) == a  # margin 0: the model's answer
    tight = train(ts, "logistic", 0.01, margin=gap + 1e-9)
    assert tight.advise(site, other) == "default"  # not enough above the heuristic's class
    assert tight.advise(site, a) == a  # the heuristic's own action: no deviation
    just = train(ts, "logistic", 0.01, margin=gap - 1e-9)
    assert just.advise(site, other) == a
    # specialise's class is default
    assert train(ts, "logistic", 0.01, margin=p[a] - p["default"] + 1e-9).advise(
        site, "specialise") == "default"


def test_the_file_is_data_and_reads_back_exactly(tmp_path):
    """Every model kind writes and reads back to the same parameters; the text names the
    format, version, columns with ranges, guards and training data."""
    from analysis.policy_training import table_sha256
    ts = training_set(*planted(), threshold=0.01)
    for name in CLASSIFIERS:
        policy = train(ts, name, 0.01, margin=0.3, ranges=False, growth_budget=40)
        path = tmp_path / f"{name}.policy"
        save_policy_file(policy, path)
        text = path.read_text()
        assert text.splitlines()[1] == "(inlining_policy"
        assert f"(table_sha256 \"{table_sha256(ts)}\")" in text and "(sites 360)" in text
        assert "(guards (margin 0.3) (ranges false) (growth_budget 40))" in text
        assert '(column "inline_attribute=always" 0.0 1.0)' in text
        back = read_policy_file(path)
        assert back == policy, name


def test_bad_policy_files_and_data_are_one_line(tmp_path):
    (tmp_path / "x.policy").write_text("not a policy")
    with pytest.raises(PolicyFileError, match=r"x.policy:1: not a policy file"):
        read_policy_file(tmp_path / "x.policy")
    good = tmp_path / "good.policy"
    save_policy_file(train(training_set(*planted(), threshold=0.01), "boosted", 0.01), good)
    text = good.read_text()
    for broken, message in (
            (text.replace("(version 1)", "(version 7)"), "policy format version 7"),
            (text.replace("(leaf ", "(leaf x", 1), "leaf: expected a finite number"),
            (text.replace("(margin 0.2)", "(margin nan)"), "margin: expected a finite"),
            (text[:-3], "unclosed '('"),
            (text.replace("(classes ", "(classes maybe "), "classes: expected distinct"),
            (text.replace("(split 0 ", "(split 99 ", 1), "split feature: expected an "
                                                          "integer from 0 to 4")):
        (tmp_path / "b.policy").write_text(broken)
        with pytest.raises(PolicyFileError) as err:
            read_policy_file(tmp_path / "b.policy")
        assert message in str(err.value) and "\n" not in str(err.value), str(err.value)
        assert str(err.value).startswith(f"{tmp_path / 'b.policy'}:")
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
    object each compile makes.
    """
    import hashlib

    import dispatcher.build.policies as policies
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
        seq, unit, round, key = 0, "A", 0, "D(A.f@a.ml:1:0-9)/C(A.g@a.ml:2:0-5)"
        heuristic_reason = "heuristic"
        heuristic_action = "dont_inline"

        class features:
            @staticmethod
            def row():
                return {"callee_size": 5, "evaluated_benefit": 0.3, "via_stub": False,
                        "inline_attribute": "always"}
    assert first.decide(Site()) is policies.Advice.INLINE  # type: ignore[arg-type]


def test_a_policy_in_memory_reaches_a_compile_as_its_file_s_bytes(tmp_path, monkeypatch):
    """A policy trained in this process is named to a compile from memory (``learned_spec``):
    its bytes made and hashed once, nothing written or read; the same identity (the store's
    keys) as the file those bytes are saved to, named later, and the compiler is given them."""
    import hashlib

    import dispatcher.build.policies as policies
    from dispatcher.build.policy_file import write_policy_bytes
    policy = train(training_set(*planted(), threshold=0.01), "logistic", 0.01)
    hashed = []
    real_sha256 = hashlib.sha256
    monkeypatch.setattr(policies.hashlib, "sha256",
                        lambda data=b"": hashed.append(data) or real_sha256(data))
    spec = policies.learned_spec(policy)
    assert len(hashed) == 1 and spec.trained is policy
    assert policies.compiler_policy_file(spec) is spec.data
    assert spec.identity() == f"learned:sha256:{spec.digest}" and len(hashed) == 1
    path = tmp_path / "p.policy"
    write_policy_bytes(spec.data, path)
    save_policy_file(policy, tmp_path / "q.policy")
    assert (tmp_path / "q.policy").read_bytes() == spec.data
    named = policies.parse_policy(str(path))
    assert named.identity() == spec.identity()
    assert named.data == spec.data


def test_an_old_pickled_policy_is_refused_unread(tmp_path):
    """A .policy file of an older version (a joblib pickle) is refused in one line, never
    unpickled: nothing in it runs."""
    import pickle

    import dispatcher.build.policies as policies
    marker = tmp_path / "ran"
    old = tmp_path / "old.policy"
    old.write_bytes(pickle.dumps({"format": "inlining-policy", "version": 1,
                                  "model": _Touch(marker)}, protocol=2))
    with pytest.raises(policies.PolicyError) as err:
        policies.parse_policy(str(old))
    assert str(err.value) == (f"policy {old}: a pickled policy from an older version; "
                              "retrain it with train-policy")
    assert not marker.exists()


class _Touch:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        import os
        return (os.system, (f"touch {self.path}",))


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


def test_the_growth_budget_option():
    """train-policy --growth-budget: an integer, or 0 or none for no budget; else one line."""
    import click

    from commands.train_policy import _GrowthBudget
    t = _GrowthBudget()
    assert [t.convert(v, None, None) for v in ("40", "0", "none", "None", 100)] == \
        [40, None, None, None, 100]
    for bad in ("-1", "1.5", "lots", "1000000000"):
        with pytest.raises(click.BadParameter) as err:
            t.convert(bad, None, None)
        assert "\n" not in str(err.value.message)
