"""The learned-policy file (``.policy``): writing it, reading it back, and evaluating it.

``train-policy`` fits a classifier (``analysis.policy_training``) and exports it here as plain
data: an s-expression file (the format of docs/policies.md, "The policy file") holding the
model's parameters, the feature columns with their training ranges, the thresholds, the guard
rails and the identity of the training data.  The patched compiler reads the same file
(``ocamlopt -inlining-policy FILE``, compiler/README.md) and evaluates it itself; this module
is the Python evaluator of the same semantics, used by the policy host and the tests.  Loading
never runs code: the file is data, read by a small reader below, and evaluated by our own
sequential arithmetic (no scikit-learn, numpy or pandas at load or evaluation time), so both
evaluators do the same float operations in the same order.

Both sides turn a site's features into numbers the same way (``numeric_features`` in
training, ``encode_row`` at a site), so the format and that encoding live together, below the
code that trains and the code that compiles.  A pickle (the format of earlier versions) is
refused in one line without being unpickled.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dispatcher.core.files import TextFileError, atomic_output, read_regular_bytes

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

POLICY_FORMAT = "inlining_policy"
#: The version written for a policy without growth discounts (byte for byte what it was before
#: version 2 existed); version 2 adds one guard, the growth budget's discounts.  Both are read.
POLICY_VERSION = 1
LABELS = ("inline", "dont_inline", "default")
DEFAULT_MARGIN = 0.2
# What the policy's inline answers that depart from the heuristic may add to one function in
# one round, in callee_size units (docs/policies.md, "Guard rails"): a few mid-sized callees.
DEFAULT_GROWTH_BUDGET = 100
#: The largest weight a growth discount may have (both readers).
MAX_DISCOUNT_WEIGHT = 1000.0
ACTIVATIONS = ("identity", "logistic", "tanh", "relu")


class PolicyFileError(ValueError):
    """A file that is not a policy this version reads: ``where`` names it, ``what`` says what
    was expected; the message (``where: what``) is one line."""

    def __init__(self, where: object, what: str):
        super().__init__(f"{where}: {what}")
        self.where = where
        self.what = what


def numeric_features(table: pd.DataFrame) -> pd.DataFrame:
    """Features as numbers: booleans as 0/1 and absent numbers as -1 (Flambda did not
    compute it); a text feature (an attribute: ``always``, ``never``, ...) as one 0/1 column
    per value, ``name=value``."""
    import pandas as pd
    out: dict[str, pd.Series] = {}
    for name in table.columns:
        col = table[name]
        present = col.dropna()
        if len(present) and present.map(lambda v: isinstance(v, bool)).all():
            out[name] = col.map(lambda v: -1.0 if v is None or v != v else float(bool(v)))
        elif len(present) and present.map(lambda v: isinstance(v, str)).all():
            for value in sorted(set(present)):
                out[f"{name}={value}"] = (col == value).astype(float)
        else:
            out[name] = pd.to_numeric(col, errors="coerce").fillna(-1.0).astype(float)
    return pd.DataFrame(out, index=table.index)


def encode_row(columns: Sequence[str], features: Mapping[str, Any]) -> list[float]:
    """One site's features as the model's input, column by column, exactly as
    ``numeric_features`` encodes a training row: a column ``name=value`` is 1 where the
    feature ``name`` is the text ``value``, else 0; a column ``name`` is the feature's number
    (a boolean 0/1), -1 where it is absent or not a number."""
    x = []
    for c in columns:
        name, eq, value = c.partition("=")
        v = features.get(name)
        if eq:
            x.append(1.0 if isinstance(v, str) and v == value else 0.0)
        elif isinstance(v, bool):
            x.append(1.0 if v else 0.0)
        elif isinstance(v, (int, float)) and not (isinstance(v, float) and v != v):
            x.append(float(v))
        else:
            x.append(-1.0)
    return x


class ConstantModel:
    """The 'classifier' of data with one label: always that label (training and validation
    use it as a scikit-learn model; its export is ``(constant LABEL)``)."""

    def __init__(self, value: str):
        import numpy as np
        self.value = value
        self.classes_ = np.array([value])

    def fit(self, X: Any, y: Any) -> ConstantModel:
        return self

    def predict(self, X: Any) -> np.ndarray:
        import numpy as np
        return np.array([self.value] * len(X))


# -- the models, as data, and their evaluation -------------------------------------------
#
# Every model gives raw scores: one per class, or one for two classes (the second class's
# log-odds).  ``_answer`` turns them into the model's answer and its class probabilities the
# same way for every kind.  Sums run left to right, as the compiler's evaluator runs them.


def _dot(w: Sequence[float], x: Sequence[float]) -> float:
    s = 0.0
    for a, b in zip(w, x):
        s += a * b
    return s


def _standardise(x: Sequence[float], mean: Sequence[float], scale: Sequence[float]
                 ) -> list[float]:
    return [(v - m) / s for v, m, s in zip(x, mean, scale)]


@dataclass
class Constant:
    label: str

    def scores(self, x: Sequence[float]) -> list[float]:
        return [0.0]


@dataclass
class Linear:
    """StandardScaler then a linear model: score k = sum_j w_kj * (x_j - mean_j) / scale_j +
    intercept_k."""

    mean: list[float]
    scale: list[float]
    coefficients: list[list[float]]  # one row per score
    intercepts: list[float]

    def scores(self, x: Sequence[float]) -> list[float]:
        z = _standardise(x, self.mean, self.scale)
        return [_dot(w, z) + b for w, b in zip(self.coefficients, self.intercepts)]


def _activate(name: str, v: float) -> float:
    if name == "relu":
        return v if v > 0.0 else 0.0
    if name == "tanh":
        return math.tanh(v)
    if name == "logistic":
        return 1.0 / (1.0 + math.exp(-v))
    return v


@dataclass
class Layer:
    weights: list[list[float]]  # one row per input, one column per unit
    biases: list[float]

    def apply(self, a: Sequence[float]) -> list[float]:
        out = []
        for j, b in enumerate(self.biases):
            s = 0.0
            for i, v in enumerate(a):
                s += v * self.weights[i][j]
            out.append(s + b)
        return out


@dataclass
class Mlp:
    """StandardScaler then a multi-layer perceptron: ``activation`` after every layer but the
    last, whose outputs are the scores."""

    mean: list[float]
    scale: list[float]
    activation: str
    layers: list[Layer]

    def scores(self, x: Sequence[float]) -> list[float]:
        a = _standardise(x, self.mean, self.scale)
        for i, layer in enumerate(self.layers):
            a = layer.apply(a)
            if i < len(self.layers) - 1:
                a = [_activate(self.activation, v) for v in a]
        return a


@dataclass
class Node:
    """A tree node: a leaf (``feature`` -1) or a split: ``x[feature] <= threshold`` goes to
    ``left``, else ``right`` (node indices in the tree)."""

    feature: int
    threshold: float = 0.0
    left: int = 0
    right: int = 0
    value: float = 0.0


@dataclass
class Tree:
    score: int  # which score it adds to
    nodes: list[Node]

    def value(self, x: Sequence[float]) -> float:
        n = self.nodes[0]
        while n.feature >= 0:
            n = self.nodes[n.left if x[n.feature] <= n.threshold else n.right]
        return n.value


@dataclass
class Trees:
    """Gradient-boosted trees: score k = (sum, in order, of the values of the trees of score
    k) + baseline_k (scikit-learn's order: the trees first, the baseline last)."""

    baseline: list[float]
    trees: list[Tree]

    def scores(self, x: Sequence[float]) -> list[float]:
        raw = [0.0] * len(self.baseline)
        for t in self.trees:
            raw[t.score] += t.value(x)
        return [r + b for r, b in zip(raw, self.baseline)]


Model = Constant | Linear | Mlp | Trees


def answer(classes: Sequence[str], scores: Sequence[float]) -> tuple[str, list[float]]:
    """The model's answer and its probability for each class, from its raw scores.  One
    score for two classes: the second class where the score is above 0 (a tie is the first),
    probabilities 1 - p and p with p = 1 / (1 + exp(-score)).  One score per class: the first
    highest score, probabilities the softmax of the scores (less their maximum)."""
    if len(classes) == 1:
        return classes[0], [1.0]
    if len(scores) == 1:
        s = scores[0]
        p = 1.0 / (1.0 + math.exp(-s))
        return (classes[1] if s > 0.0 else classes[0]), [1.0 - p, p]
    best = 0
    for k in range(1, len(scores)):
        if scores[k] > scores[best]:
            best = k
    top = scores[best]
    exps = [math.exp(s - top) for s in scores]
    total = 0.0
    for e in exps:
        total += e
    return classes[best], [e / total for e in exps]


@dataclass
class Column:
    name: str  # as numeric_features names it
    low: float  # the training range
    high: float


@dataclass
class TrainedPolicy:
    """A policy file's content: the model and what it needs to answer a site, with its guard
    rails (docs/policies.md, "The policy file")."""

    classifier: str
    classes: list[str]  # the model's classes, in the order of its scores
    model: Model
    columns: list[Column]
    threshold: float
    benchmarks: list[str]
    table_sha256: str = ""
    sites: int = 0
    margin: float = DEFAULT_MARGIN
    ranges: bool = True
    growth_budget: int | None = DEFAULT_GROWTH_BUDGET  # None: no budget
    #: (number feature, weight) in file order: a site's growth is its callee_size divided by
    #: 1 + sum of weight * feature (format version 2; empty: version 1, no discount)
    growth_discount: tuple[tuple[str, float], ...] = ()
    _text_values: dict[str, set[str]] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        for c in self.columns:
            name, eq, value = c.name.partition("=")
            if eq:
                self._text_values.setdefault(name, set()).add(value)

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    def predict(self, features: Mapping[str, Any]) -> str:
        """The model's own answer for one site's features, no guard rail applied (what
        scikit-learn's ``predict`` gave for the model trained)."""
        x = encode_row(self.column_names, features)
        return answer(self.classes, self.model_scores(x))[0]

    def model_scores(self, x: Sequence[float]) -> list[float]:
        return self.model.scores(x)

    def in_range(self, features: Mapping[str, Any], x: Sequence[float]) -> bool:
        """Every column within its training range, and every text feature that has columns
        one of the values seen in training."""
        for c, v in zip(self.columns, x):
            if v < c.low or v > c.high:
                return False
        for name, values in self._text_values.items():
            seen = features.get(name)
            if isinstance(seen, str) and seen not in values:
                return False
        return True

    def advise(self, features: Mapping[str, Any], heuristic_action: str = "default",
               heuristic_reason: str = "heuristic") -> str:
        """``inline``, ``dont_inline`` or ``default`` for one site, guard rails applied: a
        site the heuristic did not decide freely (an attribute forced it, a guard prevented
        it), or (``ranges``) one outside the training ranges, is ``default``; the model's
        answer is taken where it is ``default`` or the heuristic's own action, and otherwise
        only where its probability exceeds that of the heuristic's action's class
        (``specialise``: ``default``) by at least ``margin``."""
        if heuristic_reason != "heuristic":
            return "default"
        x = encode_row(self.column_names, features)
        if self.ranges and not self.in_range(features, x):
            return "default"
        a, probs = answer(self.classes, self.model_scores(x))
        own = _class_of(heuristic_action)
        if a == "default" or a == own:
            return a
        p_own = probs[self.classes.index(own)] if own in self.classes else 0.0
        return a if probs[self.classes.index(a)] - p_own >= self.margin else "default"


def function_of_key(key: str) -> str:
    """The function a call site's key is in: the key up to the end of its last ``D(...)``
    frame (a frame starts the key or follows a ``/``; it ends at the first ``)/`` after its
    start), or "" (the unit's top level) when the key has none.  The compiler's evaluator
    cuts the key by the same rule."""
    at = key.rfind("/D(")
    start = at + 1 if at >= 0 else (0 if key.startswith("D(") else -1)
    if start < 0:
        return ""
    end = key.find(")/", start)
    return key if end < 0 else key[:end + 1]


class PolicyEvaluation:
    """A policy answering one compile's decisions in the compiler's order, with the growth
    budget's state: what its ``inline`` answers that depart from the heuristic have added so
    far to each (unit, round, function).  A new unit starts afresh (``start_unit``, or a unit
    other than the last one asked about), as the compiler's evaluator starts each unit."""

    def __init__(self, policy: TrainedPolicy):
        self.policy = policy
        self.unit: str | None = None
        self.spent: dict[tuple[int, str], float] = {}

    def start_unit(self, unit: str) -> None:
        self.unit = unit
        self.spent = {}

    def advise(self, unit: str, round: int, key: str, features: Mapping[str, Any],
               heuristic_action: str = "default", heuristic_reason: str = "heuristic"
               ) -> str:
        """``TrainedPolicy.advise``, then the growth budget: an ``inline`` answer where the
        heuristic did not inline adds the site's growth (``growth``) to its function's
        spending in this round, and is answered ``default`` instead (adding nothing) where
        that would take the spending above the budget."""
        if unit != self.unit:
            self.start_unit(unit)
        a = self.policy.advise(features, heuristic_action, heuristic_reason)
        budget = self.policy.growth_budget
        if a != "inline" or heuristic_action == "inline" or budget is None:
            return a
        grows = growth(features, self.policy.growth_discount)
        where = (round, function_of_key(key))
        spent = self.spent.get(where, 0.0)
        if spent + grows > budget:
            return "default"
        self.spent[where] = spent + grows
        return a


def growth(features: Mapping[str, Any], discount: Sequence[tuple[str, float]]) -> float:
    """What inlining a site adds to its function's spending: its ``callee_size`` (0 where it
    has none), divided by 1 plus each discount's weight times its feature (an absent or
    negative number counts 0, a boolean 1 or 0), summed in file order from the 1 as the
    compiler sums it; undivided where there is no discount."""
    size = features.get("callee_size")
    grows = float(size) if isinstance(size, int) and not isinstance(size, bool) else 0.0
    divisor = 1.0
    for name, weight in discount:
        v = features.get(name)
        x = (1.0 if v else 0.0) if isinstance(v, bool) else \
            float(v) if isinstance(v, int) and v > 0 else 0.0
        divisor = divisor + weight * x
    return grows / divisor


def _class_of(action: str) -> str:
    """The label whose answer keeps the heuristic's action: itself, or ``default`` for
    ``specialise`` (no advice says specialise)."""
    return action if action in ("inline", "dont_inline") else "default"


# -- export from scikit-learn --------------------------------------------------------------

class ExportError(ValueError):
    """A trained model this format cannot hold; the message is one line."""


def _floats(a: Any) -> list[float]:
    values = [float(v) for v in a]
    if not all(math.isfinite(v) for v in values):
        raise ExportError("the model has a parameter that is not a finite number")
    return values


_LARGEST = 1.7976931348623157e308
MAX_GROWTH_BUDGET = 10**9 - 1  # both readers take up to nine digits


def export_model(model: Any) -> tuple[list[str], Model]:
    """The classes and the plain-data model of a classifier ``analysis.policy_training``
    trained: a one-label ``ConstantModel``, a StandardScaler + LogisticRegression or
    StandardScaler + MLPClassifier pipeline, or a HistGradientBoostingClassifier."""
    if isinstance(model, ConstantModel):
        return [model.value], Constant(model.value)
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler
    if isinstance(model, HistGradientBoostingClassifier):
        trees = []
        for iteration in model._predictors:
            for k, predictor in enumerate(iteration):
                nodes = []
                for n in predictor.nodes:
                    if n["is_categorical"]:
                        raise ExportError("a categorical split (not produced by train-policy)")
                    if n["is_leaf"]:
                        nodes.append(Node(-1, value=_floats([n["value"]])[0]))
                    else:
                        # an infinite threshold (every number on one side) as the largest
                        # finite one: the same sides for every finite input
                        t = max(-_LARGEST, min(_LARGEST, float(n["num_threshold"])))
                        nodes.append(Node(int(n["feature_idx"]), _floats([t])[0],
                                          int(n["left"]), int(n["right"])))
                trees.append(Tree(k, nodes))
        return ([str(c) for c in model.classes_],
                Trees(_floats(model._baseline_prediction.ravel()), trees))
    if isinstance(model, Pipeline) and len(model.steps) == 2 \
            and isinstance(model.steps[0][1], StandardScaler):
        scaler, clf = model.steps[0][1], model.steps[1][1]
        mean = _floats(scaler.mean_) if scaler.mean_ is not None else \
            [0.0] * len(scaler.scale_)
        scale = _floats(scaler.scale_)
        classes = [str(c) for c in clf.classes_]
        if isinstance(clf, LogisticRegression):
            return classes, Linear(mean, scale, [_floats(r) for r in clf.coef_],
                                   _floats(clf.intercept_))
        if isinstance(clf, MLPClassifier):
            if clf.activation not in ACTIVATIONS:
                raise ExportError(f"MLP activation {clf.activation!r}")
            layers = [Layer([_floats(r) for r in w], _floats(b))
                      for w, b in zip(clf.coefs_, clf.intercepts_)]
            return classes, Mlp(mean, scale, clf.activation, layers)
    raise ExportError(f"cannot export a {type(model).__name__} (expected a model "
                      "train-policy trains)")


# -- the file: writing -----------------------------------------------------------------------

def _num(v: float) -> str:
    """A float as the shortest text that reads back to it (both readers use strtod's
    correctly rounded parse)."""
    if not math.isfinite(v):
        raise ExportError("a number that is not finite")
    return repr(float(v))


def _str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") \
        .replace("\t", "\\t") + '"'


def _nums(vs: Sequence[float]) -> str:
    return " ".join(_num(v) for v in vs)


def _model_text(model: Model) -> list[str]:
    if isinstance(model, Constant):
        return [f" (model (constant {model.label}))"]
    if isinstance(model, Linear):
        out = [" (model", "  (linear", f"   (mean {_nums(model.mean)})",
               f"   (scale {_nums(model.scale)})", "   (coefficients"]
        out += [f"    ({_nums(r)})" for r in model.coefficients]
        out += ["   )", f"   (intercepts {_nums(model.intercepts)})))"]
        return out
    if isinstance(model, Mlp):
        out = [" (model", "  (mlp", f"   (mean {_nums(model.mean)})",
               f"   (scale {_nums(model.scale)})", f"   (activation {model.activation})"]
        for layer in model.layers:
            out.append("   (layer (weights")
            out += [f"     ({_nums(r)})" for r in layer.weights]
            out.append(f"    ) (biases {_nums(layer.biases)}))")
        out[-1] += "))"
        return out
    out = [" (model", "  (trees", f"   (baseline {_nums(model.baseline)})"]
    for t in model.trees:
        nodes = " ".join(f"(leaf {_num(n.value)})" if n.feature < 0 else
                         f"(split {n.feature} {_num(n.threshold)} {n.left} {n.right})"
                         for n in t.nodes)
        out.append(f"   (tree {t.score} {nodes})")
    out[-1] += "))"
    return out


def _budget_text(budget: int | None) -> str:
    if budget is None:
        return "none"
    if not isinstance(budget, int) or not 1 <= budget <= MAX_GROWTH_BUDGET:
        raise ExportError(f"growth budget {budget!r}: expected an integer from 1 to "
                          f"{MAX_GROWTH_BUDGET}, or None")
    return str(budget)


def _discount_text(discount: Sequence[tuple[str, float]]) -> str:
    """`` (growth_discount ("FEATURE" WEIGHT) ...)``, or "" where there is none (version 1)."""
    if not discount:
        return ""
    names = [n for n, _ in discount]
    for name, weight in discount:
        if name not in _NUMBER_FEATURES or names.count(name) > 1:
            raise ExportError(f"growth discount {name!r}: expected distinct number features "
                              "of the compiler")
        if not (isinstance(weight, (int, float)) and 0.0 <= weight <= MAX_DISCOUNT_WEIGHT):
            raise ExportError(f"growth discount {name}: weight {weight!r}, expected a number "
                              f"from 0 to {MAX_DISCOUNT_WEIGHT:g}")
    return " (growth_discount " + " ".join(f"({_str(n)} {_num(float(w))})"
                                           for n, w in discount) + ")"


def policy_text(policy: TrainedPolicy) -> str:
    """The file's text (docs/policies.md, "The policy file"): format version 1, or 2 where the
    policy has growth discounts."""
    version = 2 if policy.growth_discount else POLICY_VERSION
    lines = [
        f"; an inlining policy written by train-policy: {policy.classifier} trained on "
        f"{policy.sites} call sites",
        f"({POLICY_FORMAT}",
        f" (version {version})",
        f" (classifier {policy.classifier})",
        f" (training (benchmarks {' '.join(_str(b) for b in policy.benchmarks)}) "
        f"(sites {policy.sites}) (table_sha256 {_str(policy.table_sha256)}))",
        f" (threshold {_num(policy.threshold)})",
        f" (guards (margin {_num(policy.margin)}) "
        f"(ranges {'true' if policy.ranges else 'false'}) "
        f"(growth_budget {_budget_text(policy.growth_budget)})"
        f"{_discount_text(policy.growth_discount)})",
        f" (classes {' '.join(policy.classes)})",
        " (columns",
    ]
    lines += [f"  (column {_str(c.name)} {_num(c.low)} {_num(c.high)})" for c in policy.columns]
    lines.append(" )")
    lines += _model_text(policy.model)
    lines[-1] += ")"
    return "\n".join(lines) + "\n"


def policy_bytes(policy: TrainedPolicy) -> bytes:
    """The file's bytes (UTF-8 text): what the compiler reads, what a learned policy's
    identity is the sha256 of (``dispatcher.build.policies.learned_spec``)."""
    return policy_text(policy).encode("utf-8")


def write_policy_bytes(data: bytes, path: Path) -> None:
    """Write a policy file's bytes to ``path`` atomically; OSError if it cannot be written."""
    with atomic_output(path) as tmp:
        tmp.write_bytes(data)


def save_policy_file(policy: TrainedPolicy, path: Path) -> None:
    """Write ``policy`` to ``path`` atomically; OSError if it cannot be written."""
    write_policy_bytes(policy_bytes(policy), path)


# -- the file: reading ---------------------------------------------------------------------
#
# The grammar is docs/policies.md's ("The policy file"); the compiler's reader
# (middle_end/flambda/inlining_policy_file.ml in compiler/flambda-inlining.patch) enforces the
# same one, check for check, and tests/test_policy_grammar.py feeds both the same mutated
# files.  Keep the two in step.

#: The most bytes a policy file may have (real ones are below a megabyte: a boosted model of
#: 300 trees is about 600 KB); both readers refuse a larger file before reading it.
MAX_POLICY_BYTES = 16 * 1024 * 1024
#: How deep a policy file's lists may nest (real ones: 6, an MLP's weight rows).
MAX_POLICY_DEPTH = 16
CLASSIFIERS = ("logistic", "boosted", "mlp", "constant")

# One token: a parenthesis, a whole string (any escape, checked after), a quote that opens no
# string (a raw newline or the end of the file before its closing quote), a comment, an atom.
# Blanks (space, tab, newline, carriage return) are what no token takes.
_TOKEN = re.compile(r'[()]|"(?:[^"\\\n]|\\[^\n])*"|"|;[^\n]*|[^ \t\n\r()";]+')
_ESCAPE = re.compile(r'\\(.)')
_UNESCAPE = {'"': '"', "\\": "\\", "n": "\n", "t": "\t"}
_NUMBER = re.compile(r"-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
_BUDGET = re.compile(r"[1-9][0-9]{0,8}")
_SHA256 = re.compile(r"(?:[0-9a-f]{64})?")
_UNROLL = re.compile(r"\(unroll -?[0-9]+\)")


class _List(list):
    """A list of the file: its items (an atom is a str, a string the str of its token, double
    quotes and escapes included, so that no string is ever equal to a keyword) and ``at``,
    the index of its '(' among the file's tokens, for the line of a message."""

    __slots__ = ("at",)
    at: int


class _Malformed(Exception):
    def __init__(self, at: int, message: str):
        super().__init__(message)
        self.at = at  # the index of the token where the file is wrong


def _is_atom(v: Any) -> bool:
    return type(v) is str and v[:1] != '"'


def _is_string(v: Any) -> bool:
    return type(v) is str and v[:1] == '"'


def _text(v: str) -> str:
    """A string token's text, its escapes undone (it was checked when read)."""
    body = v[1:-1]
    return _ESCAPE.sub(lambda e: _UNESCAPE[e.group(1)], body) if "\\" in body else body


def _short(s: str) -> str:
    """A text of the file in a message: at most 40 characters, escaped (one short line)."""
    cut = s if len(s) <= 40 else s[:40]
    out = cut.encode("unicode_escape").decode("ascii")
    return out + "..." if len(s) > 40 else out


def _describe(v: Any) -> str:
    if isinstance(v, _List):
        return "a list" if v else "()"
    if _is_string(v):
        return f'string "{_short(_text(v))}"'
    return f"atom {_short(v)}"


def _parse(text: str) -> _List:
    """The top-level values of ``text``; _Malformed at the first token outside the grammar
    (a ')' that closes nothing, a list deeper than MAX_POLICY_DEPTH, a string that does not
    end on its line or holds another escape than \" \\ \n \t, a '(' never closed)."""
    tokens = _TOKEN.findall(text)
    root = _List()
    root.at = 0
    stack = [root]
    top = root
    for i, tok in enumerate(tokens):
        c = tok[0]
        if c == "(":
            if len(stack) > MAX_POLICY_DEPTH:
                raise _Malformed(i, f"lists nested more than {MAX_POLICY_DEPTH} deep")
            new = _List()
            new.at = i
            top.append(new)
            stack.append(new)
            top = new
        elif c == ")":
            if len(stack) == 1:
                raise _Malformed(i, "unexpected ')'")
            stack.pop()
            top = stack[-1]
        elif c == '"':
            if len(tok) == 1:
                raise _Malformed(i, "unterminated string (a newline or the end of the file "
                                    "before its closing quote)")
            if "\\" in tok:
                for e in _ESCAPE.finditer(tok, 1, len(tok) - 1):
                    if e.group(1) not in _UNESCAPE:
                        raise _Malformed(i, f"invalid escape \\{_short(e.group(1))} in string "
                                            "(expected \\\" \\\\ \\n \\t)")
            top.append(tok)
        elif c != ";":
            top.append(tok)
    if len(stack) > 1:
        raise _Malformed(stack[-1].at, "unclosed '(': expected ')' before the end of the file")
    return root


def _line_of(text: str, at: int) -> int:
    """The line of the ``at``-th token of ``text`` (only for a message: tokenised again)."""
    for i, m in enumerate(_TOKEN.finditer(text)):
        if i == at:
            return text.count("\n", 0, m.start()) + 1
    return text.count("\n") + 1


def _fail(where: _List, message: str) -> _Malformed:
    return _Malformed(where.at, message)


def _number(v: Any, what: str, where: _List) -> float:
    if _is_atom(v) and _NUMBER.fullmatch(v):
        x = float(v)
        if math.isfinite(x):
            return x
    raise _fail(where, f"{what}: expected a finite number, got {_describe(v)}")


def _numbers(vs: Sequence[Any], what: str, where: _List, count: int | None = None
             ) -> list[float]:
    out = [_number(v, what, where) for v in vs]
    if count is not None and len(out) != count:
        raise _fail(where, f"{what}: expected {count} numbers, got {len(out)}")
    return out


def _index(v: Any, what: str, below: int, where: _List) -> int:
    # (one to nine ASCII digits, [0-9]{1,9}, without a regular expression: trees call
    # this for every node)
    if type(v) is str and len(v) <= 9 and v.isascii() and v.isdigit() and int(v) < below:
        return int(v)
    raise _fail(where, f"{what}: expected an integer from 0 to {below - 1}, got "
                       f"{_describe(v)}")


def _sections(items: Sequence[Any], what: str, names: Sequence[str], where: _List
              ) -> dict[str, _List]:
    """``(name value ...)`` items, each of ``names`` once, named by a bare atom: name -> the
    section (its values from index 1)."""
    out: dict[str, _List] = {}
    for item in items:
        head = item[0] if isinstance(item, _List) and item else None
        if not (_is_atom(head) and head in names):
            raise _fail(item if isinstance(item, _List) else where,
                        f"{what}: expected one of ({' ...), ('.join(names)} ...), got "
                        f"{_describe(item)}")
        name = str(head)
        if name in out:
            raise _fail(item, f"{what}: ({name} ...) twice")
        out[name] = item
    for n in names:
        if n not in out:
            raise _fail(where, f"{what}: missing ({n} ...)")
    return out


def _one(section: _List, what: str) -> Any:
    if len(section) != 2:
        raise _fail(section, f"{what}: expected one value, got {len(section) - 1}")
    return section[1]


def _keyword(v: Any, what: str, choices: Sequence[str], where: _List) -> str:
    if _is_atom(v) and v in choices:
        return v
    raise _fail(where, f"{what}: expected {' or '.join(choices)}, got {_describe(v)}")


def _scale(section: _List, n: int) -> list[float]:
    scale = _numbers(section[1:], "scale", section, n)
    if any(x <= 0.0 for x in scale):
        raise _fail(section, "scale: expected numbers above 0")
    return scale


def _rows(items: Sequence[Any], what: str, count: int, where: _List) -> list[list[float]]:
    out = []
    for row in items:
        if not isinstance(row, _List):
            raise _fail(where, f"{what}: expected a row, got {_describe(row)}")
        out.append(_numbers(row, what, row, count))
    return out


def _model(section: _List, n_columns: int, classes: list[str]) -> Model:
    n_classes = len(classes)
    n_scores = 1 if n_classes == 2 else n_classes
    if len(section) != 2 or not isinstance(section[1], _List) or not section[1] \
            or not _is_atom(section[1][0]):
        raise _fail(section, "model: expected (model (constant|linear|mlp|trees ...))")
    m = section[1]
    kind = m[0]
    if kind == "constant":
        if n_classes != 1:
            raise _fail(m, "model: a constant model has one class")
        if len(m) != 2 or not _is_atom(m[1]) or m[1] != classes[0]:
            raise _fail(m, f"model: expected (constant {classes[0]}), the one class")
        return Constant(m[1])
    if kind in ("linear", "mlp", "trees") and n_classes < 2:
        raise _fail(m, f"classes: a {kind} model has at least two classes")
    if kind == "linear":
        s = _sections(m[1:], "linear", ("mean", "scale", "coefficients", "intercepts"), m)
        mean = _numbers(s["mean"][1:], "mean", s["mean"], n_columns)
        scale = _scale(s["scale"], n_columns)
        rows = s["coefficients"]
        if len(rows) - 1 != n_scores:
            raise _fail(rows, f"coefficients: expected {n_scores} rows (one per score)")
        coefficients = _rows(rows[1:], "coefficients", n_columns, rows)
        intercepts = _numbers(s["intercepts"][1:], "intercepts", s["intercepts"], n_scores)
        return Linear(mean, scale, coefficients, intercepts)
    if kind == "mlp":
        def is_layer(x: Any) -> bool:
            return isinstance(x, _List) and len(x) > 0 and x[0] == "layer"
        s = _sections([x for x in m[1:] if not is_layer(x)], "mlp",
                      ("mean", "scale", "activation"), m)
        mean = _numbers(s["mean"][1:], "mean", s["mean"], n_columns)
        scale = _scale(s["scale"], n_columns)
        activation = _keyword(_one(s["activation"], "activation"), "activation",
                              ACTIVATIONS, s["activation"])
        layers, width = [], n_columns
        for item in m[1:]:
            if not is_layer(item):
                continue
            ls = _sections(item[1:], "layer", ("weights", "biases"), item)
            biases = _numbers(ls["biases"][1:], "biases", ls["biases"])
            if not biases:
                raise _fail(item, "layer: expected at least one bias")
            weights = _rows(ls["weights"][1:], "weights", len(biases), ls["weights"])
            if len(weights) != width:
                raise _fail(ls["weights"], f"layer: expected {width} rows of {len(biases)} "
                                           "weights")
            layers.append(Layer(weights, biases))
            width = len(biases)
        if not layers or width != n_scores:
            raise _fail(m, f"mlp: expected layers ending with {n_scores} outputs")
        return Mlp(mean, scale, activation, layers)
    if kind == "trees":
        if len(m) < 2 or not isinstance(m[1], _List) or not m[1] or m[1][0] != "baseline":
            raise _fail(m, "trees: expected (baseline ...) first")
        baseline = _numbers(m[1][1:], "baseline", m[1], n_scores)
        trees = []
        for t in m[2:]:
            if not (isinstance(t, _List) and len(t) >= 3 and t[0] == "tree"):
                raise _fail(t if isinstance(t, _List) else m,
                            f"trees: expected (tree SCORE NODE ...), got {_describe(t)}")
            score = _index(t[1], "tree", n_scores, t)
            n = len(t) - 2
            nodes = []
            for nv in t[2:]:
                if isinstance(nv, _List) and len(nv) == 2 and nv[0] == "leaf":
                    nodes.append(Node(-1, value=_number(nv[1], "leaf", nv)))
                elif isinstance(nv, _List) and len(nv) == 5 and nv[0] == "split":
                    nodes.append(Node(_index(nv[1], "split feature", n_columns, nv),
                                      _number(nv[2], "split threshold", nv),
                                      _index(nv[3], "split left", n, nv),
                                      _index(nv[4], "split right", n, nv)))
                else:
                    raise _fail(nv if isinstance(nv, _List) else t,
                                "node: expected (leaf VALUE) or (split FEATURE THRESHOLD "
                                f"LEFT RIGHT), got {_describe(nv)}")
            for i, node in enumerate(nodes):  # children after their parent: no cycle
                if node.feature >= 0 and (node.left <= i or node.right <= i):
                    raise _fail(t, "split: expected children after their parent")
            trees.append(Tree(score, nodes))
        return Trees(baseline, trees)
    raise _fail(m, f"model: expected constant, linear, mlp or trees, got atom {_short(kind)}")


def _column_features() -> tuple[frozenset[str], dict[str, Any]]:
    """The features a column may name: numbers and booleans by name, text features as
    ``name=VALUE`` with VALUE one the compiler writes (a predicate per text feature); every
    feature of a dump but ``round`` (part of a site's key)."""
    from dispatcher.core.decisions import _EVALUATION_KINDS, _FEATURE_KINDS
    numbers = frozenset(n for n, kind in _FEATURE_KINDS.items() if kind != "str" and n != "round")

    def attribute(v: str) -> bool:
        return v in ("always", "never", "hint", "default") or bool(_UNROLL.fullmatch(v))

    def specialise(v: str) -> bool:
        return v in ("always", "never", "default")

    texts = {"inline_attribute": attribute, "inlined_attribute": attribute,
             "specialise_attribute": specialise, "specialised_attribute": specialise,
             "evaluation": lambda v: v in _EVALUATION_KINDS}
    assert set(texts) == {n for n, kind in _FEATURE_KINDS.items() if kind == "str"}, texts
    return numbers, texts


_NUMBER_FEATURES, _TEXT_FEATURES = _column_features()


def number_features() -> frozenset[str]:
    """The features a column may name by their name alone (numbers and booleans)."""
    return _NUMBER_FEATURES


def _column_name(name: str, where: _List) -> None:
    """A column name must name a feature of the compiler (``_column_features``)."""
    feature, eq, value = name.partition("=")
    if eq:
        check = _TEXT_FEATURES.get(feature)
        if check is None:
            raise _fail(where, f'column "{_short(name)}": expected a feature of the compiler '
                               f"({_short(feature)} is not a text feature)")
        if not check(value):
            raise _fail(where, f'column "{_short(name)}": {feature} is never {_short(value)}')
    elif name not in _NUMBER_FEATURES:
        if name in _TEXT_FEATURES:
            raise _fail(where, f'column "{name}": a text feature\'s column is {name}=VALUE')
        raise _fail(where, f'column "{_short(name)}": expected a feature of the compiler')


def _training(section: _List) -> tuple[list[str], int, str]:
    t = _sections(section[1:], "training", ("benchmarks", "sites", "table_sha256"), section)
    benchmarks: list[str] = []
    seen: set[str] = set()
    for b in t["benchmarks"][1:]:
        if not _is_string(b):
            raise _fail(t["benchmarks"], f"benchmarks: expected a string, got {_describe(b)}")
        name = _text(b)
        if not name:
            raise _fail(t["benchmarks"], 'benchmarks: expected a name, got ""')
        if name in seen:
            raise _fail(t["benchmarks"], f'benchmarks: "{_short(name)}" twice')
        seen.add(name)
        benchmarks.append(name)
    sites = _index(_one(t["sites"], "sites"), "sites", 10**9, t["sites"])
    digest = _one(t["table_sha256"], "table_sha256")
    if not (_is_string(digest) and _SHA256.fullmatch(_text(digest))):
        raise _fail(t["table_sha256"], "table_sha256: expected a string of 64 lowercase "
                                       f'hexadecimal digits (or ""), got {_describe(digest)}')
    return benchmarks, sites, _text(digest)


def decode_policy_file(data: bytes, where: object) -> TrainedPolicy:
    """The policy in ``data``, the bytes of a file ``save_policy_file`` wrote (``where``
    names it in messages); PolicyFileError (one line) otherwise.  From bytes, so a caller
    that also hashes the file reads it once and loads exactly what it hashed.  A pickle (a
    policy file of an older version) is refused without being unpickled."""
    if data[:1] == b"\x80":
        raise PolicyFileError(where, "a pickled policy from an older version; retrain it "
                                     "with train-policy")
    if len(data) > MAX_POLICY_BYTES:
        raise PolicyFileError(where, f"{len(data)} bytes, more than the {MAX_POLICY_BYTES} a "
                                     "policy file may have")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise PolicyFileError(f"{where}:{line}", f"expected UTF-8 text (byte {exc.start} is "
                                                 "not)") from None
    try:
        return _decode(text)
    except _Malformed as exc:
        raise PolicyFileError(f"{where}:{_line_of(text, exc.at)}", str(exc)) from None


def _decode(text: str) -> TrainedPolicy:
    forms = _parse(text)
    expected = f"expected ({POLICY_FORMAT} (version 1|2) ...)"
    if not forms:
        raise _Malformed(0, f"empty file, {expected}")
    top = forms[0]
    if not (isinstance(top, _List) and top and top[0] == POLICY_FORMAT):
        raise _fail(top if isinstance(top, _List) else forms,
                    f"not a policy file: {expected}, got {_describe(top)} (train one with "
                    "train-policy)")
    if len(forms) > 1:
        second = forms[1]
        raise _fail(second if isinstance(second, _List) else forms,
                    f"unexpected second top-level form, {expected}")
    version = next((x for x in top[1:] if isinstance(x, _List) and x and x[0] == "version"),
                   None)
    if version is None:
        raise _fail(top, f"{POLICY_FORMAT}: missing (version 1|2)")
    if version[1:] not in (["1"], ["2"]):
        got = "missing" if len(version) == 1 else \
            _short(version[1]) if _is_atom(version[1]) else _describe(version[1])
        raise _fail(version, f"policy format version {got}; this version reads 1 or 2")
    v2 = version[1] == "2"
    s = _sections(top[1:], POLICY_FORMAT, ("version", "classifier", "training", "threshold",
                                           "guards", "classes", "columns", "model"), top)
    classifier = _keyword(_one(s["classifier"], "classifier"), "classifier", CLASSIFIERS,
                          s["classifier"])
    benchmarks, sites, digest = _training(s["training"])
    threshold_v = _one(s["threshold"], "threshold")
    threshold = _number(threshold_v, "threshold", s["threshold"])
    if threshold < 0.0:
        raise _fail(s["threshold"], f"threshold: expected a number from 0, got "
                                    f"{_describe(threshold_v)}")
    g = _sections(s["guards"][1:], "guards", ("margin", "ranges", "growth_budget") +
                  (("growth_discount",) if v2 else ()), s["guards"])
    margin_v = _one(g["margin"], "margin")
    margin = _number(margin_v, "margin", g["margin"])
    if not 0.0 <= margin <= 1.0:
        raise _fail(g["margin"], f"margin: expected a number from 0 to 1, got "
                                 f"{_describe(margin_v)}")
    ranges = _keyword(_one(g["ranges"], "ranges"), "ranges", ("true", "false"), g["ranges"])
    budget_v = _one(g["growth_budget"], "growth_budget")
    growth_budget = None
    if budget_v != "none":
        if not (_is_atom(budget_v) and _BUDGET.fullmatch(budget_v)):
            raise _fail(g["growth_budget"], f"growth_budget: expected none or an integer from "
                                            f"1 to {MAX_GROWTH_BUDGET}, got "
                                            f"{_describe(budget_v)}")
        growth_budget = int(budget_v)
    discount = _discount(g["growth_discount"]) if v2 else ()
    classes = []
    for c in s["classes"][1:]:
        if not (_is_atom(c) and c in LABELS):
            raise _fail(s["classes"], f"classes: expected distinct labels among "
                                      f"{', '.join(LABELS)}, got {_describe(c)}")
        classes.append(c)
    if not classes or len(set(classes)) != len(classes):
        raise _fail(s["classes"], f"classes: expected distinct labels among "
                                  f"{', '.join(LABELS)}")
    columns = []
    names: set[str] = set()
    for c in s["columns"][1:]:
        if not (isinstance(c, _List) and len(c) == 4 and c[0] == "column"
                and _is_string(c[1])):
            raise _fail(c if isinstance(c, _List) else s["columns"],
                        f'columns: expected (column "NAME" MIN MAX), got {_describe(c)}')
        name = _text(c[1])
        _column_name(name, c)
        if name in names:
            raise _fail(c, f'column "{_short(name)}" twice')
        names.add(name)
        low, high = _number(c[2], "column min", c), _number(c[3], "column max", c)
        if low > high:
            raise _fail(c, f'column "{_short(name)}": min above max')
        columns.append(Column(name, low, high))
    model = _model(s["model"], len(columns), classes)
    return TrainedPolicy(classifier=classifier, classes=classes, model=model,
                         columns=columns, threshold=threshold, benchmarks=benchmarks,
                         table_sha256=digest, sites=sites, margin=margin,
                         ranges=ranges == "true", growth_budget=growth_budget,
                         growth_discount=discount)


def _discount(section: _List) -> tuple[tuple[str, float], ...]:
    """``(growth_discount ("FEATURE" WEIGHT) ...)``: distinct number features of the compiler,
    each weight a number from 0 to MAX_DISCOUNT_WEIGHT."""
    out: list[tuple[str, float]] = []
    for item in section[1:]:
        if not (isinstance(item, _List) and len(item) == 2 and _is_string(item[0])):
            raise _fail(item if isinstance(item, _List) else section,
                        f'growth_discount: expected ("FEATURE" WEIGHT), got {_describe(item)}')
        name = _text(item[0])
        if name not in _NUMBER_FEATURES:
            raise _fail(item, f'growth_discount: "{_short(name)}" is not a number feature of '
                              "the compiler")
        if any(name == n for n, _ in out):
            raise _fail(item, f'growth_discount: "{_short(name)}" twice')
        weight = _number(item[1], "growth_discount weight", item)
        if not 0.0 <= weight <= MAX_DISCOUNT_WEIGHT:
            raise _fail(item, "growth_discount: expected a weight from 0 to 1000, got "
                              f"{_describe(item[1])}")
        out.append((name, weight))
    return tuple(out)


def read_policy_bytes(path: Path | str) -> bytes:
    """The bytes of the policy file ``path``: a regular file of at most MAX_POLICY_BYTES (a
    FIFO, a device or a directory is refused without being waited on or read);
    PolicyFileError (one line naming it) otherwise."""
    try:
        return read_regular_bytes(Path(path), MAX_POLICY_BYTES)
    except FileNotFoundError:
        raise PolicyFileError(path, "no such policy file") from None
    except TextFileError as exc:  # it names the file
        raise PolicyFileError(path, str(exc).removeprefix(f"{path}: ")) from None


def read_policy_file(path: Path) -> TrainedPolicy:
    """The policy in the file ``path``; PolicyFileError (one line) if there is none."""
    return decode_policy_file(read_policy_bytes(path), path)
