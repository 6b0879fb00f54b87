"""The one validation idiom of configs and manifests: a strict YAML loader and a reader.

Both formats come from a user's hand and both are read up front, so a slip (a key given twice,
``.nan`` for a timeout, a misspelt key) is refused before anything runs, as one line naming
the file and the key: ``FILE: KEY: expected WHAT, got VALUE``.  ``StrictLoader`` refuses what
plain YAML would keep silently; ``Reader`` makes the one-line errors and holds the common
checks, raising whatever error its caller's format has (``ConfigError`` for configs,
``ManifestError`` for manifests).  The rundir's records are validated by pydantic instead
(``core.records``): they are written by this program, not by hand.
"""
from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable, TypeVar

import yaml

#: Upper bounds of the config's counts and durations (documented in configs/local.yaml): past
#: them a value is a slip (a million seconds, a zero too many) that would fail hours later, or
#: never, in a job; it is refused up front with the file and key instead.  Here, below config
#: assembly, because backends check their own sections against them too.
MAX_SECONDS = 24 * 3600  # run.timeout, scheduler.backoff_max_s (and local.lock_wait)
MAX_BACKOFF_S = 3600  # scheduler.backoff_s, ssh.connect_timeout
MAX_RUNS = 10_000  # run.runs, search.baseline_runs, measure.max_pairs
MAX_STEPS = 1_000_000  # search.steps, search.remeasure_every, measure.canary_every
MAX_CHAINS = 1_000  # search.chains, search.max_flips, scheduler.quarantine_after
MAX_ATTEMPTS = 100  # scheduler.attempts
MAX_PARALLEL = 1_024  # compile.jobs, search.candidates_per_step, search.in_flight
MAX_SEED = 2 ** 63 - 1  # search.seed, either sign


_E = TypeVar("_E", bound="FileKeyError")


class FileKeyError(ValueError):
    """A file that cannot be used because of one key: the message is one line,
    ``FILE: KEY: MESSAGE``, as ``Reader`` makes it (configs, campaign files)."""

    @classmethod
    def at(cls: type[_E], file: str, key: str, message: str) -> _E:
        return cls(f"{file}: {key}: {message}")


class KeyPathError(Exception):
    """A problem ``StrictLoader`` found at a key path (``run.timeout``, ``ssh.hosts[0].port``).

    ``line`` is the 1-based line of the offending node; ``duplicate`` is True for a key given
    twice, whose value (as constructed) is ``value``; else ``value`` is the scalar's text.
    """

    def __init__(self, key: str, message: str, *, line: int, duplicate: bool = False,
                 value: Any = None):
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message
        self.line = line
        self.duplicate = duplicate
        self.value = value


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that also refuses, at any depth, a key given twice in one mapping
    (plain YAML keeps the last silently) and a number that is not finite (``.nan``, ``.inf``,
    ``-.inf``, a float that overflows such as ``1.0e+999``), naming the key path.

    The checks walk the composed node tree before anything is constructed, so the path of every
    node is known.  A merge key (``<<: *anchor``) is not a duplicate of the keys it brings in.
    """

    def construct_document(self, node: yaml.Node) -> Any:
        self._check(node, "", set())
        return super().construct_document(node)

    def _check(self, node: yaml.Node, path: str, seen: set[int]) -> None:
        if id(node) in seen:  # an alias of a node checked already (or a recursive one)
            return
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys: set[Any] = set()
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    self._check(value_node, path, seen)
                    continue
                self._check(key_node, path, seen)
                name = key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"
                where = f"{path}.{name}" if path else str(name)
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in keys
                    keys.add(key)
                except TypeError:  # unhashable: the constructor reports it
                    duplicate = False
                if duplicate:
                    line = key_node.start_mark.line + 1
                    raise KeyPathError(where, f"duplicate key (line {line})", line=line,
                                       duplicate=True, value=key)
                self._check(value_node, where, seen)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self._check(item, f"{path}[{i}]", seen)
        elif node.tag == "tag:yaml.org,2002:float" and isinstance(node, yaml.ScalarNode):
            try:
                finite = math.isfinite(self.construct_yaml_float(node))
            except ValueError:  # an explicit !!float on something else
                finite = False
            if not finite:
                raise KeyPathError(path or "(top level)",
                                   f"expected a finite number, got {node.value}",
                                   line=node.start_mark.line + 1, value=node.value)


def load_strict(text: str) -> Any:
    """``text`` as YAML, through ``StrictLoader``: KeyPathError for a duplicate key or a
    number that is not finite, ``yaml.YAMLError`` for anything else."""
    return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass


def load_strict_file(path: Path, error: Callable[[str], Exception]) -> Any:
    """The YAML file at ``path`` through ``load_strict``; whatever stops it is one line made
    into the caller's error by ``error``: unreadable (``read_utf8``'s line), a key path's
    problem (``FILE: KEY: MESSAGE``), a syntax error (``FILE:LINE:COL: YAML syntax error:
    PROBLEM``).  The loader of configs and campaign files."""
    from dispatcher.core.files import TextFileError, read_utf8
    try:
        return load_strict(read_utf8(path))
    except TextFileError as exc:
        raise error(str(exc)) from None
    except KeyPathError as exc:
        raise error(f"{path}: {exc.key}: {exc.message}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise error(f"{where}: YAML syntax error: {problem}") from None


def finite_number(v: Any) -> bool:
    """An int or float (not a bool) that is finite as a float (a huge int is not)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def type_name(value: Any) -> str:
    """How a value of the wrong kind is named in an error: YAML's words, not Python's."""
    if value is None:
        return "null"
    names = {bool: "bool", int: "int", float: "float", str: "string", list: "list",
             dict: "mapping"}
    return names.get(type(value), type(value).__name__)


class Reader:
    """One file's one-line errors and the common value checks.

    ``error(file, key, message)`` makes the exception to raise: the format's own error class
    (``ManifestError``) or a factory of it (``ConfigError.at``).  Every check returns the value
    or raises; ``fail`` and friends return the exception so that the caller writes ``raise``
    (and the type checker sees the branch end).  ``unnamed`` stands for the file when there is
    none (a config given as data).
    """

    def __init__(self, path: Path | str | None, error: Callable[[str, str, str], Exception],
                 *, unnamed: str = "<unnamed>"):
        self.path = Path(path) if path is not None else None
        self.file = str(path) if path is not None else unnamed
        self._error = error

    # ------------------------------------------------------------------ the errors

    def error(self, key: str, message: str) -> Exception:
        """``FILE: KEY: MESSAGE``."""
        return self._error(self.file, key, message)

    def fail(self, key: str, expected: str, got: Any = None) -> Exception:
        """``FILE: KEY: expected EXPECTED, got repr(GOT)`` (no ``got`` when it is None)."""
        tail = "" if got is None else f", got {got!r}"
        return self.error(key, f"expected {expected}{tail}")

    def fail_kind(self, key: str, expected: str, value: Any) -> Exception:
        """``FILE: KEY: expected EXPECTED, got KIND``: the value's kind (int, list, null),
        where its text would not help."""
        return self.error(key, f"expected {expected}, got {type_name(value)}")

    # ------------------------------------------------------------------ config sections
    # A section is an optional mapping in ``data``; values default when absent; ``name`` is
    # the key path the error shows.

    def section(self, data: dict, key: str, allowed: set[str]) -> dict:
        """``data[key]``: a mapping of ``allowed`` keys (absent or null: empty)."""
        value = data.get(key, {})
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise self.fail(key, "a mapping", value)
        unknown = sorted(set(value) - allowed)
        if unknown:
            raise self.fail(f"{key}.{unknown[0]}", f"one of {', '.join(sorted(allowed))}",)
        return value

    def positive_int(self, data: dict, key: str, name: str, default: int, *, most: int) -> int:
        v = data.get(key, default)
        if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= most:
            raise self.fail(name, f"a positive integer, at most {most}", v)
        return v

    def count(self, data: dict, key: str, name: str, default: int, *, most: int,
              what: str = "a number of steps") -> int:
        """A whole number where 0 means never."""
        v = data.get(key, default)
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= most:
            raise self.fail(name, f"{what} from 0 (never) to {most}", v)
        return v

    def positive_number(self, data: dict, key: str, name: str, default: float, *, most: float,
                        what: str = "a positive number") -> float:
        v = data.get(key, default)
        if not finite_number(v) or not 0 < v <= most:
            raise self.fail(name, f"{what}, at most {most:g}", v)
        return float(v)

    def boolean(self, data: dict, key: str, name: str, default: bool) -> bool:
        v = data.get(key, default)
        if not isinstance(v, bool):
            raise self.fail(name, "true or false", v)
        return v

    def local_path(self, value: Any, name: str, expected: str = "a file path") -> Path:
        """A path on the master: ~ expanded, relative to the file's directory."""
        if not isinstance(value, str) or not value or "\0" in value:
            raise self.fail(name, expected, value)
        p = Path(os.path.expanduser(value))
        return p if p.is_absolute() else (self.path.parent if self.path else Path.cwd()) / p

    # ------------------------------------------------------------------ required structure
    # The value is given (a manifest's); a wrong kind is named by ``type_name``.

    def mapping(self, value: Any, key: str, allowed: Sequence[str],
                required: Sequence[str]) -> dict:
        """A mapping of string keys, each ``allowed``, with every ``required`` one."""
        if not isinstance(value, dict):
            raise self.fail_kind(key, "a mapping", value)
        prefix = f"{key}." if key != "(top level)" else ""
        for k in value:
            if not isinstance(k, str):
                raise self.fail_kind(f"{prefix}{k!r}", "a string key", k)
            if k not in allowed:
                raise self.error(f"{prefix}{k}", f"unknown key (allowed: {', '.join(allowed)})")
        for k in required:
            if k not in value:
                raise self.error(f"{prefix}{k}", "missing required key")
        return value

    def string(self, value: Any, key: str, *, nonempty: bool = True) -> str:
        """A string without NUL (and, ``nonempty``, not blank)."""
        if not isinstance(value, str):
            hint = ' (quote it: "...")' if isinstance(value, (int, float, bool)) else ""
            raise self.fail_kind(key, f"a string{hint}", value)
        if nonempty and not value.strip():
            raise self.error(key, "expected a non-empty string")
        if "\0" in value:
            raise self.error(key, "expected a string without NUL characters")
        return value

    def string_list(self, value: Any, key: str) -> tuple[str, ...]:
        """A list of strings without NUL."""
        if not isinstance(value, list):
            raise self.fail_kind(key, "a list of strings", value)
        out = []
        for i, item in enumerate(value):
            if not isinstance(item, str):
                hint = ' (quote numbers: "64")' if isinstance(item, (int, float, bool)) else ""
                raise self.fail_kind(f"{key}[{i}]", f"a string{hint}", item)
            if "\0" in item:
                raise self.error(f"{key}[{i}]", "expected a string without NUL characters")
            out.append(item)
        return tuple(out)


def shown(value: Any) -> str:
    """A value from a file as an error line shows it: its repr, cut at 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _key_part(part: Any) -> str:
    """One step of a key path as an error line names it: a name from the file that is not
    plain (a newline, a dot, a control character) is quoted, so the line stays one line."""
    text = str(part)
    return text if text.isprintable() and text and "." not in text else shown(text)


def first_model_error(exc: Any) -> tuple[str, str]:
    """The first error of a pydantic ``ValidationError`` as (key, message) for a
    ``FILE: KEY: MESSAGE, got VALUE`` line (no value when the key is missing)."""
    err = exc.errors()[0]
    key = ".".join(_key_part(p) for p in err["loc"]) or "(the whole file)"
    got = "" if err["type"] == "missing" else f", got {shown(err.get('input'))}"
    return key, f"{err['msg'][:1].lower()}{err['msg'][1:]}{got}"
