"""The learned-policy file (``.policy``): writing it, reading it back, and the policy it holds.

``train-policy`` fits a classifier (``analysis.policy_training``) and saves it here; a compile
with that file as its policy reads it here and asks ``TrainedPolicy.advise`` at each call
site.  Both sides turn a site's features into numbers the same way (``numeric_features``),
so the format and that encoding live together, below the code that trains and the code that
compiles.

A policy file is a pickle (joblib) of a dict with a format name, a version and the feature
columns the model expects: load only policy files you made, as any pickle runs code when
loaded.  pandas, numpy and joblib are imported when first needed: a compile without a learned
policy never pays for them.
"""
from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dispatcher.core.files import atomic_output

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

POLICY_FORMAT = "inlining-policy"
POLICY_VERSION = 1


class PolicyFileError(ValueError):
    """A file that is not a policy this version reads; the message is one line."""


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


class ConstantModel:
    """The 'classifier' of data with one label: always that label.  Pickled into the policy
    files of such data, hence here (files written before it moved name it
    ``analysis.policy_training._Constant``, which still names this class)."""

    def __init__(self, value: str):
        import numpy as np
        self.value = value
        self.classes_ = np.array([value])

    def fit(self, X: Any, y: Any) -> ConstantModel:
        return self

    def predict(self, X: Any) -> np.ndarray:
        import numpy as np
        return np.array([self.value] * len(X))


@dataclass
class TrainedPolicy:
    """A classifier with what it needs to answer the policy channel."""

    classifier: str
    model: Any
    columns: list[str]
    threshold: float
    benchmarks: list[str]

    def advise(self, features: Mapping[str, Any]) -> str:
        """``inline``, ``dont_inline`` or ``default`` for one call site's features."""
        import pandas as pd
        row = numeric_features(pd.DataFrame([dict(features)]))
        # a text value never seen in training, or a feature absent: as in training, an
        # indicator column is 0 and an absent number -1
        row = row.reindex(columns=self.columns).fillna(
            {c: 0.0 if "=" in c else -1.0 for c in self.columns})
        return str(self.model.predict(row.to_numpy())[0])


def save_policy_file(policy: TrainedPolicy, path: Path) -> None:
    """Write ``policy`` to ``path`` atomically; OSError if it cannot be written."""
    import joblib
    with atomic_output(path) as tmp:
        joblib.dump({"format": POLICY_FORMAT, "version": POLICY_VERSION,
                     "classifier": policy.classifier, "model": policy.model,
                     "columns": policy.columns, "threshold": policy.threshold,
                     "benchmarks": policy.benchmarks}, tmp)


def decode_policy_file(data: bytes, where: object) -> TrainedPolicy:
    """The policy in ``data``, the bytes of a file ``save_policy_file`` wrote (``where``
    names it in messages); PolicyFileError (one line) otherwise.  From bytes, so a caller
    that also hashes the file reads it once and loads exactly what it hashed."""
    import joblib
    try:
        content = joblib.load(io.BytesIO(data))
    except Exception as exc:  # not a pickle, truncated, another library's
        raise PolicyFileError(f"{where}: not a policy file ({type(exc).__name__})") from None
    if not isinstance(content, dict) or content.get("format") != POLICY_FORMAT:
        raise PolicyFileError(f"{where}: not a policy file (train one with train-policy)")
    if content.get("version") != POLICY_VERSION:
        raise PolicyFileError(f"{where}: policy format version {content.get('version')!r}; "
                              f"this version reads {POLICY_VERSION}")
    return TrainedPolicy(classifier=content["classifier"], model=content["model"],
                         columns=list(content["columns"]),
                         threshold=float(content["threshold"]),
                         benchmarks=list(content["benchmarks"]))


def read_policy_file(path: Path) -> TrainedPolicy:
    """The policy in the file ``path``; PolicyFileError (one line) if there is none."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise PolicyFileError(f"{path}: no such policy file") from None
    except OSError as exc:
        raise PolicyFileError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return decode_policy_file(data, path)
