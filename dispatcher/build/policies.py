"""Inlining policies: what answers the compiler's questions on the policy channel.

The patched ``ocamlopt -inlining-policy-channel BASE`` sends one observation per decision (the
call site's key, callee, features and the heuristic's own answer) and reads one advice:
``inline``, ``dont_inline`` or ``default`` (compiler/README.md, "Policy channel").  A policy is
any object with ``decide(observation) -> Advice`` (``Policy``); ``dispatcher.build.policy_host``
serves one over the channel.

A compile names its policy by a ``PolicySpec`` (hashable, part of the compile's cache key):
``heuristic`` (always ``default``: the compiler's own heuristic), ``never-inline``
(``dont_inline`` everywhere the compiler can keep a call), ``always-inline`` (``inline``
wherever the heuristic decided freely) or an overrides file such as an
``optimal.sexp`` (its action for a listed key, ``default`` for the others), or a ``.policy``
file ``train-policy`` wrote (``learned``; its format: ``dispatcher.build.policy_file``).
``POLICY_KINDS`` maps each kind to what makes its policy object from a spec
(``policy_of_spec``); ``compiler_policy_file`` gives the kinds the compiler evaluates itself
(a learned policy, always-inline) as a policy file instead.

A learned policy's spec carries its file's bytes and their sha256, computed once: from a file
when it is named (``parse_policy``: read once, checked on reading), or from a policy trained
in this process (``learned_spec``: serialised in memory, nothing written or read back).  The
same content has the same identity either way, so a compile's cache key does not depend on
whether its policy came from disk.  The compile service hands the bytes to the compiler
(``compiler_policy_file``); the only file it writes is the one the compiler reads.
"""
from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import sexpdata

from dispatcher.build.policy_file import (
    MAX_POLICY_BYTES,
    Constant,
    PolicyEvaluation,
    PolicyFileError,
    TrainedPolicy,
    decode_policy_file,
    policy_bytes,
    policy_text,
)
from dispatcher.core.decisions import (
    DecisionFileError,
    Features,
    Override,
    overrides_text,
    parse_features,
    parse_features_text,
    read_overrides,
)
from dispatcher.core.files import TextFileError, read_regular_bytes
from dispatcher.core.sexp import STRING_BODY, read_sexp, unescape


class Advice(str, enum.Enum):
    """A policy's answer for one decision, as the channel spells it."""

    INLINE = "inline"
    DONT_INLINE = "dont_inline"
    DEFAULT = "default"  # the compiler's heuristic decides


class PolicyError(ValueError):
    """A policy that cannot be named or loaded; the message is one line."""


class ObservationError(ValueError):
    """An observation line that does not follow the protocol."""


@dataclass(frozen=True)
class Observation:
    """One decision the compiler asks about (an ``(observation ...)`` line)."""

    seq: int  # its index in the session (one session per compilation unit)
    unit: str
    round: int
    key: str
    callee: str
    heuristic_action: str  # what the heuristic did: inline | dont_inline | specialise
    heuristic_reason: str  # heuristic | attribute | prevented
    heuristic_guard: str | None  # what prevented it, when prevented
    heuristic_detail: str | None  # the heuristic's own reason, when reason == heuristic
    features: Features


def _sym(x: object) -> str | None:
    return x.value() if isinstance(x, sexpdata.Symbol) else None


def _flat(x: object) -> str:
    if isinstance(x, list):
        return " ".join(_flat(y) for y in x)
    return _sym(x) or str(x)


# The features at the end of an observation line (no strings among them), as in a dump.
_OBSERVATION_FEATURES = re.compile(r" \(features([^\"\n]*)\)\)\s*$")


def _string(name: str) -> str:
    return f'"(?P<{name}>{STRING_BODY})"'


_OBSERVATION_HEAD = re.compile(
    r'\(observation \(seq (?P<seq>[0-9]+)\) \(unit ' + _string("unit")
    + r'\) \(round (?P<round>[0-9]+)\) \(key ' + _string("key")
    + r'\) \(callee ' + _string("callee")
    + r'\) \(heuristic \(action (?P<action>[a-z_]+)\) \(reason (?:(?P<reason>[a-z_]+)|'
    r'\(prevented (?P<guard>[a-z_]+)\))\)(?: \(detail (?P<detail>[a-z_]+)\))?\)\)$')


def parse_observation(line: str) -> Observation:
    """An ``(observation ...)`` line as the compiler writes it; ObservationError otherwise.

    The compiler asks once per decision and waits for the answer, so this is on the
    compile's critical path: the features (the line's last field, about four fifths of its
    tokens) are cut out and read by a regular expression, as a dump's are."""
    cut = _OBSERVATION_FEATURES.search(line)
    head = _OBSERVATION_HEAD.match(line[:cut.start()] + ")") if cut is not None else None
    if cut is None or head is None:
        return parse_observation_generic(line)
    try:  # the compiler's own layout: no s-expression reader needed
        return Observation(
            seq=int(head["seq"]), unit=unescape(head["unit"]), round=int(head["round"]),
            key=unescape(head["key"]), callee=unescape(head["callee"]),
            heuristic_action=head["action"], heuristic_reason=head["reason"] or "prevented",
            heuristic_guard=head["guard"], heuristic_detail=head["detail"],
            features=parse_features_text(cut.group(1), "observation"))
    except DecisionFileError as exc:
        raise ObservationError(f"malformed observation ({exc})") from None


def parse_observation_generic(line: str) -> Observation:
    """``parse_observation`` for any layout, through the s-expression reader."""
    features_body = None
    cut = _OBSERVATION_FEATURES.search(line)
    if cut is not None:
        features_body = cut.group(1)
        line = line[:cut.start()] + ")"
    try:
        form = read_sexp(line)
    except ValueError as exc:
        raise ObservationError(f"not an s-expression ({exc})") from None
    if not isinstance(form, list) or not form or _sym(form[0]) != "observation":
        raise ObservationError("expected (observation ...)")
    fields: dict[str, list] = {}
    for item in form[1:]:
        name = _sym(item[0]) if isinstance(item, list) and item else None
        if name is None:
            raise ObservationError(f"expected (field value ...), got {item!r}")
        fields[name] = item[1:]
    try:
        heuristic = {_sym(i[0]): i[1] for i in fields["heuristic"]
                     if isinstance(i, list) and len(i) == 2}
        reason = heuristic["reason"]
        guard = None
        if isinstance(reason, list):  # (prevented GUARD)
            guard = _flat(reason[1:])
            reason = reason[0]
        return Observation(
            seq=int(fields["seq"][0]), unit=str(fields["unit"][0]),
            round=int(fields["round"][0]), key=str(fields["key"][0]),
            callee=str(fields["callee"][0]),
            heuristic_action=_flat(heuristic["action"]), heuristic_reason=_flat(reason),
            heuristic_guard=guard,
            heuristic_detail=_flat(heuristic["detail"]) if "detail" in heuristic else None,
            features=parse_features_text(features_body, "observation")
            if features_body is not None else parse_features(fields["features"], "observation"))
    except (KeyError, IndexError, TypeError, ValueError, DecisionFileError) as exc:
        raise ObservationError(f"malformed observation ({type(exc).__name__}: {exc})") from None


class Policy(Protocol):
    """Anything that answers the compiler's questions."""

    def decide(self, observation: Observation) -> Advice:
        ...


class HeuristicPolicy:
    """Always ``default``: the build is the heuristic's (what a policy is compared with)."""

    def decide(self, observation: Observation) -> Advice:
        return Advice.DEFAULT


class NeverInlinePolicy:
    """``dont_inline`` everywhere: only what the compiler's guards and stubs force is inlined."""

    def decide(self, observation: Observation) -> Advice:
        return Advice.DONT_INLINE


class AlwaysInlinePolicy:
    """``inline`` wherever the heuristic decided freely (reason ``heuristic``), ``default``
    where an attribute or a guard decided: the other extreme from never-inline, as far as the
    compiler's guards let it go (a baseline, not a policy to use)."""

    def decide(self, observation: Observation) -> Advice:
        if observation.heuristic_reason == "heuristic":
            return Advice.INLINE
        return Advice.DEFAULT


class DecisionFilePolicy:
    """The decisions of an overrides file (an ``optimal.sexp``): its action for a (unit, round,
    key) it lists, ``default`` for any other.  ``specialise`` is answered ``default``: the
    channel has no such advice (the heuristic specialises where it sees a benefit)."""

    _ADVICE = {"inline": Advice.INLINE, "dont_inline": Advice.DONT_INLINE,
               "specialise": Advice.DEFAULT}

    def __init__(self, overrides: tuple[Override, ...]):
        self.table = {(o.unit, o.round, o.key): self._ADVICE[o.action] for o in overrides}

    def decide(self, observation: Observation) -> Advice:
        return self.table.get((observation.unit, observation.round, observation.key),
                              Advice.DEFAULT)


@dataclass(frozen=True)
class PolicySpec:
    """A policy as a compile names it: its kind and what it was loaded from.  Frozen and
    hashable: ``identity()`` joins the compile's cache key."""

    kind: str  # a key of POLICY_KINDS
    source: str = ""  # where it came from (a file), for messages
    overrides: tuple[Override, ...] = ()  # kind "decisions"
    digest: str = ""  # kind "learned": the sha256 of its policy file
    # kind "learned": what the file held when it was read and hashed, and its bytes (no part
    # of the identity: the digest is); the compiler is given exactly these bytes
    trained: TrainedPolicy | None = field(default=None, compare=False, repr=False)
    data: bytes = field(default=b"", compare=False, repr=False)

    def identity(self) -> str:
        """What determines the policy's answers (not where it was read from)."""
        if self.kind == "decisions":
            digest = hashlib.sha256(overrides_text(self.overrides).encode()).hexdigest()
            return f"decisions:sha256:{digest}"
        if self.kind == "learned":
            return f"learned:sha256:{self.digest}"
        return self.kind

    def __str__(self) -> str:
        return self.source or self.kind


class LearnedPolicy:
    """A policy file ``train-policy`` wrote, evaluated in Python (``TrainedPolicy.advise``:
    the model and its guard rails, as the compiler evaluates the same file with
    ``-inlining-policy``).  A site the heuristic did not decide freely (an attribute forced
    it, or a guard prevented it) is answered ``default``, as the policy was trained on sites
    whose decision could change.  The growth budget is spent per unit, round and function
    as the observations come, in the compiler's order; a session's first observation (seq
    0: one session per compilation unit) starts its unit afresh, as the compiler does."""

    def __init__(self, spec: PolicySpec):
        if spec.trained is None:
            raise PolicyError(f"policy {spec.source}: a learned policy is named by "
                              "parse_policy, which reads its file")
        self.trained = spec.trained
        self.evaluation = PolicyEvaluation(spec.trained)

    def decide(self, observation: Observation) -> Advice:
        if observation.seq == 0:
            self.evaluation.start_unit(observation.unit)
        return Advice(self.evaluation.advise(
            observation.unit, observation.round, observation.key,
            observation.features.row(), observation.heuristic_action,
            observation.heuristic_reason))


#: Policy kinds: name -> a loader from a spec to a policy object.
POLICY_KINDS: dict[str, Callable[[PolicySpec], Policy]] = {
    "heuristic": lambda spec: HeuristicPolicy(),
    "never-inline": lambda spec: NeverInlinePolicy(),
    "always-inline": lambda spec: AlwaysInlinePolicy(),
    "decisions": lambda spec: DecisionFilePolicy(spec.overrides),
    "learned": LearnedPolicy,
}

_NAMED = ("heuristic", "never-inline", "always-inline")
_PATH_LIKE = re.compile(r"[/\\]|\.sexp$")
LEARNED_SUFFIX = ".policy"  # what train-policy writes


def parse_policy(text: str) -> PolicySpec:
    """A policy from its name on a command line: ``heuristic``, ``never-inline``, or the path
    of an overrides file (read and checked now, so a bad file is refused before anything is
    compiled).  PolicyError, in one line, for anything else."""
    if text in _NAMED:
        return PolicySpec(text)
    if text.endswith(LEARNED_SUFFIX):
        source = str(Path(text).absolute())  # as named: a link is not followed in messages
        try:  # a regular file, bounded: never a FIFO's wait, nor /dev/zero read without end
            data = read_regular_bytes(Path(text), MAX_POLICY_BYTES)
        except FileNotFoundError:
            raise PolicyError(f"policy {text}: cannot read (No such file or directory)") from None
        except TextFileError as exc:  # it names the file as given
            raise PolicyError(f"policy {exc}") from None
        try:  # a file that is not a policy is refused before anything compiles
            trained = decode_policy_file(data, source)
        except PolicyFileError as exc:  # it names the file (and the line)
            raise PolicyError(f"policy {exc}") from None
        return _learned(data, trained, source)
    if _PATH_LIKE.search(text) or Path(text).exists():
        try:
            overrides = tuple(read_overrides(text))
        except DecisionFileError as exc:
            raise PolicyError(f"policy {text}: {exc}") from None
        except OSError as exc:
            raise PolicyError(f"policy {text}: cannot read ({exc.strerror or exc})") from None
        return PolicySpec("decisions", source=text, overrides=overrides)
    raise PolicyError(f"policy {text!r}: expected {', '.join(_NAMED)}, the path of an "
                      f"overrides file (.sexp) or of a policy file train-policy wrote "
                      f"({LEARNED_SUFFIX})")


def learned_spec(trained: TrainedPolicy, source: str = "") -> PolicySpec:
    """A policy trained in this process, as a compile names it: its file's bytes made and
    hashed here, once; nothing written or read.  Saved to a file (``write_policy_bytes``),
    those bytes give ``parse_policy`` the same identity, so the store's entries are shared."""
    return _learned(policy_bytes(trained), trained, source)


def _learned(data: bytes, trained: TrainedPolicy, source: str) -> PolicySpec:
    """The spec of a learned policy's bytes and what they hold: their sha256, the one time."""
    return PolicySpec("learned", source=source, digest=hashlib.sha256(data).hexdigest(),
                      trained=trained, data=data)


#: always-inline as a policy file the compiler evaluates itself: ``inline`` at every site the
#: heuristic decided freely (a policy file answers ``default`` elsewhere), no guard rail.  The
#: same answers as ``AlwaysInlinePolicy`` on the channel, where its builds took minutes (a
#: knucleotide unit ran past five) against about a second in the compiler.
ALWAYS_INLINE_FILE = policy_text(TrainedPolicy(
    classifier="constant", classes=["inline"], model=Constant("inline"), columns=[],
    threshold=0.0, benchmarks=[], margin=0.0, ranges=False, growth_budget=None)).encode()


def compiler_policy_file(spec: PolicySpec) -> bytes | None:
    """The policy file the compiler evaluates itself (``-inlining-policy``) for ``spec``,
    where one answers as its policy does: a learned policy's own bytes, always-inline's
    constant file; None for a policy served on the channel."""
    if spec.kind == "learned":
        return spec.data
    if spec.kind == "always-inline":
        return ALWAYS_INLINE_FILE
    return None


def policy_of_spec(spec: PolicySpec) -> Policy:
    """The policy object a spec names (nothing read: ``parse_policy`` read any file)."""
    loader = POLICY_KINDS.get(spec.kind)
    if loader is None:
        raise PolicyError(f"policy kind {spec.kind!r}: expected one of "
                          f"{', '.join(POLICY_KINDS)}")
    return loader(spec)

