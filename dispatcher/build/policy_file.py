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

from dispatcher.core.files import atomic_output
from dispatcher.core.sexp import SexpSyntaxError, scan

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

POLICY_FORMAT = "inlining_policy"
POLICY_VERSION = 1
LABELS = ("inline", "dont_inline", "default")
DEFAULT_MARGIN = 0.2
# What the policy's inline answers that depart from the heuristic may add to one function in
# one round, in callee_size units (docs/policies.md, "Guard rails"): a few mid-sized callees.
DEFAULT_GROWTH_BUDGET = 100
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
        self.spent: dict[tuple[int, str], int] = {}

    def start_unit(self, unit: str) -> None:
        self.unit = unit
        self.spent = {}

    def advise(self, unit: str, round: int, key: str, features: Mapping[str, Any],
               heuristic_action: str = "default", heuristic_reason: str = "heuristic"
               ) -> str:
        """``TrainedPolicy.advise``, then the growth budget: an ``inline`` answer where the
        heuristic did not inline adds the site's ``callee_size`` to its function's spending
        in this round, and is answered ``default`` instead (adding nothing) where that would
        take the spending above the budget."""
        if unit != self.unit:
            self.start_unit(unit)
        a = self.policy.advise(features, heuristic_action, heuristic_reason)
        budget = self.policy.growth_budget
        if a != "inline" or heuristic_action == "inline" or budget is None:
            return a
        size = features.get("callee_size")
        grows = size if isinstance(size, int) and not isinstance(size, bool) else 0
        where = (round, function_of_key(key))
        spent = self.spent.get(where, 0)
        if spent + grows > budget:
            return "default"
        self.spent[where] = spent + grows
        return a


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


def policy_text(policy: TrainedPolicy) -> str:
    """The file's text (docs/policies.md, "The policy file")."""
    lines = [
        f"; an inlining policy written by train-policy: {policy.classifier} trained on "
        f"{policy.sites} call sites",
        f"({POLICY_FORMAT}",
        f" (version {POLICY_VERSION})",
        f" (classifier {policy.classifier})",
        f" (training (benchmarks {' '.join(_str(b) for b in policy.benchmarks)}) "
        f"(sites {policy.sites}) (table_sha256 {_str(policy.table_sha256)}))",
        f" (threshold {_num(policy.threshold)})",
        f" (guards (margin {_num(policy.margin)}) "
        f"(ranges {'true' if policy.ranges else 'false'}) "
        f"(growth_budget {_budget_text(policy.growth_budget)}))",
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

class _Quoted(str):
    """A string that was written in double quotes (an atom is a plain str)."""


class _Malformed(Exception):
    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line = line


@dataclass
class _List:
    items: list[Any]
    line: int


def _read(text: str) -> list[Any]:
    """The s-expressions of ``text``: atoms (str), quoted strings (_Quoted), lists (_List).
    Tokens through ``dispatcher.core.sexp.scan``: the compiler's own grammar, which is why the
    project keeps a tokenizer of its own (this file must be refused where the compiler would)."""
    stack: list[_List] = [_List([], 1)]
    try:
        for kind, value, line in scan(text):
            if kind == "(":
                stack.append(_List([], line))
            elif kind == ")":
                if len(stack) == 1:
                    raise _Malformed(line, "unexpected ')'")
                done = stack.pop()
                stack[-1].items.append(done)
            else:
                stack[-1].items.append(_Quoted(value) if kind == "string" else value)
    except SexpSyntaxError as exc:
        raise _Malformed(exc.line, str(exc)) from None
    if len(stack) > 1:
        raise _Malformed(stack[-1].line, "unclosed '(': expected ')' before the end of the file")
    return stack[0].items


def _describe(v: Any) -> str:
    if isinstance(v, _List):
        return "a list" if v.items else "()"
    if isinstance(v, _Quoted):
        return f"string {str(v)!r}"
    return f"atom {v}"


class _Reader:
    """What a policy file's sections hold, checked; _Malformed otherwise."""

    def __init__(self, line: int):
        self.line = line

    def fail(self, what: str, v: Any = None) -> _Malformed:
        return _Malformed(v.line if isinstance(v, _List) else self.line, what)

    def num(self, v: Any, what: str) -> float:
        if isinstance(v, str) and not isinstance(v, _Quoted) and _NUMBER.fullmatch(v):
            x = float(v)
            if math.isfinite(x):
                return x
        raise self.fail(f"{what}: expected a finite number, got {_describe(v)}", v)

    def nums(self, v: Any, what: str, n: int | None = None) -> list[float]:
        items = self.items(v, what)
        if n is not None and len(items) != n:
            raise self.fail(f"{what}: expected {n} numbers, got {len(items)}", v)
        return [self.num(x, what) for x in items]

    def index(self, v: Any, what: str, below: int) -> int:
        if isinstance(v, str) and not isinstance(v, _Quoted) and re.fullmatch(r"[0-9]{1,9}", v):
            i = int(v)
            if i < below:
                return i
        raise self.fail(f"{what}: expected an integer from 0 to {below - 1}, got "
                        f"{_describe(v)}", v)

    def items(self, v: Any, what: str) -> list[Any]:
        if not isinstance(v, _List):
            raise self.fail(f"{what}: expected a list, got {_describe(v)}", v)
        if isinstance(v, _List):
            self.line = v.line
        return v.items

    def sections(self, v: Any, what: str, names: Sequence[str]) -> dict[str, list[Any]]:
        """``(name value ...)`` items, each of ``names`` exactly once."""
        out: dict[str, list[Any]] = {}
        for item in self.items(v, what):
            head = item.items[0] if isinstance(item, _List) and item.items else None
            if not isinstance(head, str) or isinstance(head, _Quoted) or head not in names:
                raise self.fail(f"{what}: expected one of ({' ...), ('.join(names)} ...), got "
                                f"{_describe(item)}" + (f" {head}" if isinstance(head, str)
                                                        else ""), item)
            if head in out:
                raise self.fail(f"{what}: ({head} ...) twice", item)
            out[head] = item.items[1:]
        for n in names:
            if n not in out:
                raise self.fail(f"{what}: missing ({n} ...)", v)
        return out

    def one(self, values: list[Any], what: str) -> Any:
        if len(values) != 1:
            raise self.fail(f"{what}: expected one value, got {len(values)}")
        return values[0]


_NUMBER = re.compile(r"-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


def _model(r: _Reader, v: Any, n_columns: int, n_classes: int) -> Model:
    items = r.items(v, "model")
    if len(items) != 1 or not isinstance(items[0], _List) or not items[0].items:
        raise r.fail("model: expected (model (constant|linear|mlp|trees ...))", v)
    kind = items[0].items[0]
    body = _List(items[0].items[1:], items[0].line)
    n_scores = 1 if n_classes == 2 else n_classes
    if kind == "constant":
        if n_classes != 1:
            raise r.fail("model: a constant model has one class", v)
        return Constant(r.one(body.items, "constant"))
    if n_classes < 2:
        raise r.fail(f"classes: a {kind} model has at least two classes", v)
    if kind == "linear":
        s = r.sections(body, "linear", ("mean", "scale", "coefficients", "intercepts"))
        mean = r.nums(_List(s["mean"], body.line), "mean", n_columns)
        scale = r.nums(_List(s["scale"], body.line), "scale", n_columns)
        if len(s["coefficients"]) != n_scores:
            raise r.fail(f"coefficients: expected {n_scores} rows (one per score)", v)
        coefs = [r.nums(row, "coefficients", n_columns) for row in s["coefficients"]]
        intercepts = r.nums(_List(s["intercepts"], body.line), "intercepts", n_scores)
        if any(x == 0.0 for x in scale):
            raise r.fail("scale: expected no 0", v)
        return Linear(mean, scale, coefs, intercepts)
    if kind == "mlp":
        def is_layer(x: Any) -> bool:
            return isinstance(x, _List) and x.items[:1] == ["layer"]
        head = [x for x in body.items if not is_layer(x)]
        s = r.sections(_List(head, body.line), "mlp", ("mean", "scale", "activation"))
        mean = r.nums(_List(s["mean"], body.line), "mean", n_columns)
        scale = r.nums(_List(s["scale"], body.line), "scale", n_columns)
        activation = r.one(s["activation"], "activation")
        if activation not in ACTIVATIONS:
            raise r.fail(f"activation: expected one of {', '.join(ACTIVATIONS)}, got "
                         f"{_describe(activation)}", v)
        layers, width = [], n_columns
        for item in body.items:
            if is_layer(item):
                ls = r.sections(_List(item.items[1:], item.line), "layer",
                                ("weights", "biases"))
                rows = [r.nums(row, "weights") for row in ls["weights"]]
                biases = r.nums(_List(ls["biases"], item.line), "biases")
                if len(rows) != width or any(len(row) != len(biases) for row in rows):
                    raise r.fail(f"layer: expected {width} rows of {len(biases)} weights", item)
                layers.append(Layer(rows, biases))
                width = len(biases)
        if not layers or width != n_scores:
            raise r.fail(f"mlp: expected layers ending with {n_scores} outputs", v)
        if any(x == 0.0 for x in scale):
            raise r.fail("scale: expected no 0", v)
        return Mlp(mean, scale, str(activation), layers)
    if kind == "trees":
        if not body.items or not isinstance(body.items[0], _List) \
                or body.items[0].items[:1] != ["baseline"]:
            raise r.fail("trees: expected (baseline ...) first", v)
        baseline = r.nums(_List(body.items[0].items[1:], body.line), "baseline", n_scores)
        trees = []
        for t in body.items[1:]:
            items = r.items(t, "tree")
            if len(items) < 3 or items[0] != "tree":
                raise r.fail("trees: expected (tree SCORE NODE ...)", t)
            score = r.index(items[1], "tree", n_scores)
            node_items = items[2:]
            nodes = []
            for nv in node_items:
                ni = r.items(nv, "node")
                if len(ni) == 2 and ni[0] == "leaf":
                    nodes.append(Node(-1, value=r.num(ni[1], "leaf")))
                elif len(ni) == 5 and ni[0] == "split":
                    nodes.append(Node(r.index(ni[1], "split feature", n_columns),
                                      r.num(ni[2], "split threshold"),
                                      r.index(ni[3], "split left", len(node_items)),
                                      r.index(ni[4], "split right", len(node_items))))
                else:
                    raise r.fail("node: expected (leaf VALUE) or (split FEATURE THRESHOLD "
                                 "LEFT RIGHT)", nv)
            for i, n in enumerate(nodes):  # children after their parent: no cycle
                if n.feature >= 0 and not (n.left > i and n.right > i):
                    raise r.fail("split: expected children after their parent", t)
            trees.append(Tree(score, nodes))
        return Trees(baseline, trees)
    raise r.fail(f"model: expected constant, linear, mlp or trees, got {_describe(kind)}", v)


def decode_policy_file(data: bytes, where: object) -> TrainedPolicy:
    """The policy in ``data``, the bytes of a file ``save_policy_file`` wrote (``where``
    names it in messages); PolicyFileError (one line) otherwise.  From bytes, so a caller
    that also hashes the file reads it once and loads exactly what it hashed.  A pickle (a
    policy file of an older version) is refused without being unpickled."""
    if data[:1] == b"\x80":
        raise PolicyFileError(where, "a pickled policy from an older version; retrain it "
                                     "with train-policy")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise PolicyFileError(where, "not a policy file (not UTF-8 text; train one with "
                                     "train-policy)") from None
    try:
        return _decode(text)
    except _Malformed as exc:
        raise PolicyFileError(f"{where}:{exc.line}", str(exc)) from None


def _decode(text: str) -> TrainedPolicy:
    forms = _read(text)
    expected = f"expected ({POLICY_FORMAT} (version {POLICY_VERSION}) ...)"
    if len(forms) != 1 or not isinstance(forms[0], _List) or not forms[0].items \
            or forms[0].items[0] != POLICY_FORMAT:
        raise _Malformed(forms[0].line if forms and isinstance(forms[0], _List) else 1,
                         f"not a policy file: {expected} (train one with train-policy)")
    top = forms[0]
    r = _Reader(top.line)
    version = next((x.items[1:] for x in top.items[1:] if isinstance(x, _List)
                    and x.items[:1] == ["version"]), None)
    if version != [str(POLICY_VERSION)]:
        raise _Malformed(top.line, f"policy format version "
                                   f"{' '.join(map(str, version or [])) or 'missing'}; this "
                                   f"version reads {POLICY_VERSION}")
    s = r.sections(_List(top.items[1:], top.line), POLICY_FORMAT,
                   ("version", "classifier", "training", "threshold", "guards", "classes",
                    "columns", "model"))
    classifier = r.one(s["classifier"], "classifier")
    if not isinstance(classifier, str) or isinstance(classifier, _Quoted):
        raise r.fail("classifier: expected an atom")
    training = r.sections(_List(s["training"], top.line), "training",
                          ("benchmarks", "sites", "table_sha256"))
    benchmarks = [str(b) for b in training["benchmarks"]]
    sites = r.index(r.one(training["sites"], "sites"), "sites", 10**9)
    digest = str(r.one(training["table_sha256"], "table_sha256"))
    threshold = r.num(r.one(s["threshold"], "threshold"), "threshold")
    guards = r.sections(_List(s["guards"], top.line), "guards",
                        ("margin", "ranges", "growth_budget"))
    margin = r.num(r.one(guards["margin"], "margin"), "margin")
    ranges = r.one(guards["ranges"], "ranges")
    if ranges not in ("true", "false") or isinstance(ranges, _Quoted):
        raise r.fail(f"ranges: expected true or false, got {_describe(ranges)}")
    budget_text = r.one(guards["growth_budget"], "growth_budget")
    growth_budget = None
    if budget_text != "none" or isinstance(budget_text, _Quoted):
        if not (isinstance(budget_text, str) and not isinstance(budget_text, _Quoted)
                and re.fullmatch(r"[1-9][0-9]{0,8}", budget_text)):
            raise r.fail(f"growth_budget: expected none or an integer from 1 to "
                         f"{MAX_GROWTH_BUDGET}, got {_describe(budget_text)}")
        growth_budget = int(budget_text)
    classes = [str(c) for c in s["classes"]]
    if not classes or any(c not in LABELS for c in classes) or len(set(classes)) != len(classes):
        raise r.fail(f"classes: expected distinct labels among {', '.join(LABELS)}")
    columns = []
    for c in s["columns"]:
        items = r.items(c, "column")
        if len(items) != 4 or items[0] != "column" or not isinstance(items[1], _Quoted):
            raise r.fail('columns: expected (column "NAME" MIN MAX)', c)
        low, high = r.num(items[2], "column min"), r.num(items[3], "column max")
        if low > high:
            raise r.fail(f"column {items[1]}: min above max", c)
        columns.append(Column(str(items[1]), low, high))
    model = _model(r, _List(s["model"], top.line), len(columns), len(classes))
    if isinstance(model, Constant) and model.label != classes[0]:
        raise r.fail("model: a constant model answers its one class")
    return TrainedPolicy(classifier=str(classifier), classes=classes, model=model,
                         columns=columns, threshold=threshold, benchmarks=benchmarks,
                         table_sha256=digest, sites=sites, margin=margin,
                         ranges=ranges == "true", growth_budget=growth_budget)


def read_policy_file(path: Path) -> TrainedPolicy:
    """The policy in the file ``path``; PolicyFileError (one line) if there is none."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise PolicyFileError(path, "no such policy file") from None
    except OSError as exc:
        raise PolicyFileError(path, f"cannot read ({exc.strerror or exc})") from None
    return decode_policy_file(data, path)
