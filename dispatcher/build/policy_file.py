"""The learned-policy file (``.policy``): writing it, reading it back, and the policy it holds.

``train-policy`` fits a classifier (``analysis.policy_training``) and saves it here; a compile
with that file as its policy reads it here and asks ``TrainedPolicy.advise`` at each call
site.  Both sides turn a site's features into numbers the same way (``numeric_features``),
so the format and that encoding live together, below the code that trains and the code that
compiles.

A policy file is a pickle (joblib) of a dict with a format name, a version and the feature
columns the model expects: use only policy files you made yourself.  Since any pickle can run
code when loaded, it is read with a restricted unpickler (``_PolicyUnpickler``) that admits
only the classes train-policy writes (scikit-learn's estimators of the classifiers it trains,
numpy arrays, dtypes and random states, ``ConstantModel``) and refuses any other name before
anything is called.  pandas, numpy and joblib are imported when first needed: a compile
without a learned policy never pays for them.
"""
from __future__ import annotations

import io
import pickle
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


#: What a policy file may name, exactly: numpy's array, dtype and random-state
#: reconstructors, joblib's array wrapper, our constant model (and its name before it moved).
_ALLOWED_NAMES = {
    ("joblib.numpy_pickle", "NumpyArrayWrapper"),
    ("numpy", "dtype"), ("numpy", "ndarray"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "scalar"),
    ("numpy.random._pickle", "__bit_generator_ctor"),
    ("numpy.random._pickle", "__generator_ctor"),
    ("numpy.random._pickle", "__randomstate_ctor"),
    ("numpy.random._mt19937", "MT19937"), ("numpy.random._pcg64", "PCG64"),
    ("numpy.random._pcg64", "PCG64DXSM"), ("numpy.random._philox", "Philox"),
    ("numpy.random._sfc64", "SFC64"), ("numpy.random.mtrand", "RandomState"),
    ("numpy.random._generator", "Generator"),
    ("numpy.random.bit_generator", "SeedSequence"),
    ("numpy.random.bit_generator", "__pyx_unpickle_SeedSequence"),
    ("dispatcher.build.policy_file", "ConstantModel"),
    ("analysis.policy_training", "_Constant"),
}
#: Packages whose classes (defined there, not imported) a policy's model may be made of: the
#: estimators of train-policy's classifiers and what they hold (losses, binners, trees).
_ALLOWED_PACKAGES = ("sklearn.pipeline", "sklearn.preprocessing", "sklearn.linear_model",
                     "sklearn.neural_network", "sklearn.ensemble._hist_gradient_boosting",
                     "sklearn._loss")


class _Refused(Exception):
    """A name a policy file may not hold; its message names it."""


def _admit(module: str, name: str) -> Any:
    """The object ``module.name`` if a policy file may name it; _Refused before anything of
    it is called (importing an allowed scikit-learn module runs only scikit-learn's code)."""
    if (module, name) in _ALLOWED_NAMES:
        if module == "analysis.policy_training" or module == __name__:
            return ConstantModel
        return getattr(__import__(module, fromlist=[name]), name)
    in_package = any(module == p or module.startswith(p + ".") for p in _ALLOWED_PACKAGES)
    if in_package and name.isidentifier() and ".tests" not in module:
        found = getattr(__import__(module, fromlist=[name]), name, None)
        if isinstance(found, type) and found.__module__ == module:
            return found
        if name.startswith("__pyx_unpickle_") and callable(found):  # Cython classes' state
            return found
    raise _Refused(f"{module}.{name}")


def _load_restricted(data: bytes) -> Any:
    """What joblib.load would give for ``data``, through an unpickler that admits only
    ``_admit``'s names, including in the nested pickle of an array of objects."""
    from joblib.numpy_pickle import NDArrayWrapper, NumpyArrayWrapper, NumpyUnpickler

    class Inner(pickle._Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            return _admit(module, name)

    class Outer(NumpyUnpickler):
        dispatch = NumpyUnpickler.dispatch.copy()

        def __init__(self, handle: io.BytesIO):
            try:
                super().__init__("", handle, ensure_native_byte_order=True)
            except TypeError:  # joblib before 1.5
                super().__init__("", handle)

        def find_class(self, module: str, name: str) -> Any:
            return _admit(module, name)

        def load_build(self) -> None:
            target, state = self.stack[-2], self.stack[-1]
            if isinstance(target, NDArrayWrapper):  # joblib < 0.10: arrays in other files
                raise _Refused("joblib.numpy_pickle.NDArrayWrapper")
            dtype = state.get("dtype") if isinstance(state, dict) else None
            if isinstance(target, NumpyArrayWrapper) and getattr(dtype, "hasobject", False):
                # an array of objects is a nested pickle: read it restricted too, whatever
                # joblib's version would use
                pickle._Unpickler.load_build(self)  # type: ignore[attr-defined]
                self.stack[-1] = Inner(self.file_handle).load()
                return
            NumpyUnpickler.load_build(self)

        dispatch[pickle.BUILD[0]] = load_build

    return Outer(io.BytesIO(data)).load()


def decode_policy_file(data: bytes, where: object) -> TrainedPolicy:
    """The policy in ``data``, the bytes of a file ``save_policy_file`` wrote (``where``
    names it in messages); PolicyFileError (one line) otherwise.  From bytes, so a caller
    that also hashes the file reads it once and loads exactly what it hashed.  Read through
    ``_load_restricted``: a pickle naming anything else is refused without running it."""
    try:
        content = _load_restricted(data)
    except _Refused as exc:
        raise PolicyFileError(f"{where}: not a policy file: it names {exc}, which no policy "
                              "holds (a .policy file is a pickle: use only files you made "
                              "yourself)") from None
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
