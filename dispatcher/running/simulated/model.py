"""The simulation's performance model: what a simulated binary's runs take, as data.

A program's modelled run time is its heuristic build's (``run_s``) times ``exp(-sum of the
log speedups of the effects that hold)`` in the candidate's real tree (the decisions the
simulated compiler took), times an optional per-binary layout factor (``layout_sd``: a
lognormal drawn from the binary's identity, so every distinct binary differs a little, the
same each time it is run).  An effect holds when its decision was taken (the site is in the
tree with that action) and so were all the decisions it ``requires``: an interaction, such as
a call whose inlining only pays once its caller's closure is inlined too.  Each run then draws
multiplicative lognormal noise of coefficient of variation ``noise.cv`` (mean 1); a run is
disturbed with probability ``noise.disturbed`` (its CPU share falls to ``disturbed_share``,
below the measurement floor, and its wall time stretches accordingly, so the master's CPU-share
judge throws it away and a comparison runs another round); a job loses its slot with
probability ``noise.lost`` (``WorkerLost``: the scheduler runs it again elsewhere).

The exact metric (a counted run, ``measure.metric`` instructions or cycles): a binary's counts
follow from its mean modelled run time alone (``exact_counts``: no noise, the same numbers
every time), and a counted run takes ``count_s`` of slot time (its program's heuristic build
under cachegrind; a binary that runs faster counts faster).  A build takes ``compile_s``: a
number, a lognormal (``mean``, ``cv``) or a list of measured seconds, either drawn from the
candidate's decisions (``CompileTime.draw``: the same for the same binary).

Where a program spends its time (``heat``, what a profile job samples): a share ``hot_share``
of its functions runs, each with a heavy-tailed weight drawn from the seed, and every function
holding a planted effect's decision runs with at least ``planted_heat`` of the samples, and
at least the share its effect saves (a call cannot save 5% of a run that spends less than 5%
where it is); ``heat`` names the functions and their weights instead.

Pure: no clocks, no threads.  The randomness comes from the ``random.Random`` the caller
hands in (the backend seeds one per slot from ``seed``).  docs/simulation.md.
"""
from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import Any

from dispatcher.core.decisions import ACTIONS
from dispatcher.core.records import RunRecord
from dispatcher.core.validation import MAX_SECONDS, MAX_SEED, Reader, finite_number

MAX_LOG_SPEEDUP = 5.0  # e^5: a planted effect beyond 150x is a typo
HEAT_SD = 1.5  # sd of a running function's log weight: a few functions take most samples
RUNTIME_SHARE = 0.1  # of a profile's samples in the binary: the runtime's (in no function)
ELSEWHERE_SHARE = 0.01  # of a profile's samples: outside the binary (libraries, kernel)


@dataclass(frozen=True, order=True)
class Condition:
    """A decision taken: the site (unit, round, key) decided ``action`` in the real tree."""

    unit: str
    round: int
    key: str
    action: str


@dataclass(frozen=True)
class Effect:
    """``log_speedup`` (log of time without over time with: above 0 is faster) while ``when``
    holds and every one of ``requires`` does too."""

    when: Condition
    log_speedup: float
    requires: tuple[Condition, ...] = ()

    def holds(self, taken: Mapping[tuple[str, int, str], str]) -> bool:
        """Whether the effect applies to a tree whose decisions are ``taken``
        ((unit, round, key) -> action)."""
        return all(taken.get((c.unit, c.round, c.key)) == c.action
                   for c in (self.when, *self.requires))


@dataclass(frozen=True)
class CompileTime:
    """One build's model seconds: ``mean_s`` every time; with ``cv`` a lognormal of that
    mean; with ``samples`` one of those (measured) seconds.  Drawn from the candidate's
    decisions (``draw``), so a build of the same tree takes the same time."""

    mean_s: float = 1.0
    cv: float = 0.0
    samples: tuple[float, ...] = ()

    def draw(self, identity: str) -> float:
        """The seconds a build of the decisions ``identity`` (their hash) takes."""
        if self.samples:
            pick = int(hashlib.sha256(f"compile/{identity}".encode()).hexdigest()[:12], 16)
            return self.samples[pick % len(self.samples)]
        if self.cv > 0:
            return self.mean_s * lognormal_factor(random.Random(f"compile/{identity}"), self.cv)
        return self.mean_s

    def canonical(self) -> float | dict[str, Any]:
        """As the model's identity writes it: a plain number when it is one (the form of the
        models before distributions, so their identities and stores stay theirs)."""
        if self.samples:
            return {"samples": list(self.samples)}
        if self.cv > 0:
            return {"mean": self.mean_s, "cv": self.cv}
        return self.mean_s


COUNT_S = 2.0  # a counted run of a heuristic build: cachegrind's median at tiny size, about


@dataclass(frozen=True)
class ProgramModel:
    """One program's modelled times (seconds of model time) and planted effects."""

    run_s: float = 1.0  # one run of the heuristic build
    compile_s: CompileTime = CompileTime()  # one build
    count_s: float = COUNT_S  # one counted (exact) run of the heuristic build
    cpu_share: float = 0.98  # a quiet run's CPU time over its wall time
    layout_sd: float = 0.0  # sd of the per-binary log factor (0: none)
    effects: tuple[Effect, ...] = ()
    hot_share: float = 0.25  # share of its functions (besides the effects') that run
    planted_heat: float = 0.2  # least share of the samples of a planted decision's function
    heat: tuple[tuple[str, float], ...] = ()  # (function, weight): the profile, if given

    def log_speedup(self, taken: Mapping[tuple[str, int, str], str]) -> float:
        """The summed log speedup of the effects that hold in ``taken``."""
        return sum(e.log_speedup for e in self.effects if e.holds(taken))

    def mean_run_s(self, taken: Mapping[tuple[str, int, str], str], identity: str) -> float:
        """The mean modelled run time of the binary of decisions ``taken`` (``identity``: its
        hash, which draws its layout factor)."""
        layout = 0.0
        if self.layout_sd > 0:
            layout = random.Random(identity).gauss(0.0, self.layout_sd)
        return self.run_s * math.exp(layout - self.log_speedup(taken))

    def canonical(self) -> dict[str, Any]:
        """As the model's identity writes it (``count_s`` only where it is not the default,
        and a constant ``compile_s`` as a number: earlier models keep their identity)."""
        data = asdict(self)
        data["compile_s"] = self.compile_s.canonical()
        if self.count_s == COUNT_S:
            del data["count_s"]
        return data

    def function_heat(self, name: str, functions: Sequence[str],
                      planted: Mapping[str, float], seed: int) -> dict[str, float]:
        """Each running function's share of the time of program ``name``, from its
        ``functions`` (sorted) and those holding planted decisions (function -> the least
        share: what its effects save).  ``heat`` when given, else drawn from ``seed``."""
        if self.heat:
            weights = {f: w for f, w in self.heat if w > 0}
        else:
            rng = random.Random(f"heat/{seed}/{name}")
            others = [f for f in functions if f not in planted]
            running = set(rng.sample(others, round(self.hot_share * len(others))))
            weights = {f: rng.lognormvariate(0.0, HEAT_SD) for f in functions
                       if f in running or f in planted}
            total = sum(weights.values())
            for f, least in planted.items():  # weight w of a total T + w - old is share s
                if f in weights and least > 0:
                    rest = total - weights[f]
                    weights[f] = max(weights[f], least * rest / max(1.0 - least, 1e-9))
                    total = rest + weights[f]
        total = sum(weights.values())
        return {f: w / total for f, w in sorted(weights.items())} if total > 0 else {}


@dataclass(frozen=True)
class Noise:
    """What varies from run to run and job to job."""

    cv: float = 0.01  # coefficient of variation of a run's wall time (lognormal, mean 1)
    disturbed: float = 0.0  # probability that a run is disturbed
    disturbed_share: float = 0.5  # the CPU share of a disturbed run (below the floor)
    lost: float = 0.0  # probability that a job loses its slot (WorkerLost)
    job_overhead_s: float = 0.005  # model seconds a job takes beyond its runs (agent, I/O)


@dataclass(frozen=True)
class Model:
    """The whole model: per program (by benchmark name), a default for the others, the noise,
    and the seed of every draw."""

    programs: Mapping[str, ProgramModel] = field(
        default_factory=lambda: MappingProxyType({}))
    default: ProgramModel = ProgramModel()
    noise: Noise = Noise()
    seed: int = 0

    def program(self, name: str) -> ProgramModel:
        return self.programs.get(name, self.default)

    def __reduce__(self) -> tuple:
        """Pickled with its programs as a plain dict (a mapping proxy does not pickle), for
        the simulated build processes (``build_processes``)."""
        return (_model, (dict(self.programs), self.default, self.noise, self.seed))

    def identity(self) -> str:
        """sha256 of the model's canonical JSON: simulated binaries of two models never
        share a cache key (it joins the simulated compiler's identity)."""
        data = {"programs": {k: v.canonical() for k, v in sorted(self.programs.items())},
                "default": self.default.canonical(), "noise": asdict(self.noise),
                "seed": self.seed}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _model(programs: dict[str, ProgramModel], default: ProgramModel, noise: Noise,
           seed: int) -> Model:
    return Model(MappingProxyType(programs), default, noise, seed)


def lognormal_factor(rng: random.Random, cv: float) -> float:
    """A multiplicative noise factor of mean 1 and coefficient of variation ``cv``."""
    if cv <= 0:
        return 1.0
    sigma = math.sqrt(math.log1p(cv * cv))
    return rng.lognormvariate(-sigma * sigma / 2, sigma)


def draw_run(rng: random.Random, mean_s: float, program: ProgramModel, noise: Noise,
             cpu: int, aslr: bool, check_output: bool) -> RunRecord:
    """One run's record, shaped as the real agent's (wall, user and sys time, CPU share,
    output check), of a binary whose mean modelled time is ``mean_s``."""
    wall = mean_s * lognormal_factor(rng, noise.cv)
    share = min(program.cpu_share * (1 + rng.gauss(0.0, 0.002)), 0.999)
    if rng.random() < noise.disturbed:
        # Something else had the CPU: the binary's CPU time is what it was, its wall stretches.
        cpu_time = wall * share
        share = noise.disturbed_share
        wall = cpu_time / share
    cpu_time = wall * share
    return RunRecord(wall_ns=int(wall * 1e9), user_s=cpu_time * 0.97, sys_s=cpu_time * 0.03,
                     maxrss_kb=4096, exit_status=0, output_ok=True if check_output else None,
                     cpu_share=share, cpu_share_source="rusage", nivcsw=0,
                     cpus_allowed=str(cpu), aslr=aslr, strays=0)


# Cachegrind's events per instruction executed (``workers/agent/cachegrind.EVENTS``): round
# figures of a compiled OCaml program (about 0.3 reads and 0.15 writes, 0.15 conditional
# branches per instruction, a few misses per thousand).  With the default cycle weights
# (``dispatcher.core.cycles``) they make 1.415 estimated cycles per instruction.
PER_INSTRUCTION = {"I1mr": 0.001, "ILmr": 0.0001, "Dr": 0.3, "D1mr": 0.01, "DLmr": 0.001,
                   "Dw": 0.15, "D1mw": 0.005, "DLmw": 0.0005, "Bc": 0.15, "Bcm": 0.005,
                   "Bi": 0.01, "Bim": 0.001}
CLOCK_HZ = 3e9  # the modelled core: a binary's estimated cycles are its mean run time at 3 GHz
CYCLES_PER_INSTRUCTION = 1.415


def exact_counts(mean_s: float) -> dict[str, int]:
    """Cachegrind's counts for a binary whose mean modelled run time is ``mean_s``: a pure
    function of it (an exact metric has no noise), every ratio between two binaries in
    instructions or cycles that of their modelled times (to rounding)."""
    ir = round(mean_s * CLOCK_HZ / CYCLES_PER_INSTRUCTION)
    return {"Ir": ir, **{event: round(ir * rate) for event, rate in PER_INSTRUCTION.items()}}


def count_run(mean_s: float, program: ProgramModel, cpu: int, check_output: bool
              ) -> RunRecord:
    """One counted run's record, shaped as the agent's under cachegrind (its counts; no CPU
    share: a count is never judged disturbed), of a binary whose mean modelled run time is
    ``mean_s``; it takes ``count_s`` scaled by that time over the heuristic build's."""
    wall = program.count_s * mean_s / program.run_s
    return RunRecord(wall_ns=int(wall * 1e9), user_s=wall * 0.97, sys_s=wall * 0.03,
                     maxrss_kb=65536, exit_status=0, output_ok=True if check_output else None,
                     cpus_allowed=str(cpu), aslr=False, strays=0,
                     counts=exact_counts(mean_s))


# --------------------------------------------------------------------------- as data


def _number(r: Reader, data: dict, key: str, name: str, default: float, low: float,
            high: float, low_open: bool = False, what: str = "a number") -> float:
    v = data.get(key, default)
    ok = finite_number(v) and (low < v if low_open else low <= v) and v <= high
    if not ok:
        bound = f"{'above' if low_open else 'from'} {low:g} to {high:g}"
        raise r.fail(name, f"{what} {bound}", v)
    return float(v)


def _condition(r: Reader, data: Any, name: str) -> Condition:
    d = r.mapping(data, name, ("unit", "round", "key", "action"),
                  ("unit", "round", "key", "action"))
    round_ = d["round"]
    if not isinstance(round_, int) or isinstance(round_, bool) or round_ < 0:
        raise r.fail(f"{name}.round", "a round number from 0", round_)
    if d["action"] not in ACTIONS:
        raise r.fail(f"{name}.action", " or ".join(ACTIONS), d["action"])
    return Condition(r.string(d["unit"], f"{name}.unit"), round_,
                     r.string(d["key"], f"{name}.key"), d["action"])


def _effect(r: Reader, data: Any, name: str) -> Effect:
    d = r.mapping(data, name, ("unit", "round", "key", "action", "log_speedup", "requires"),
                  ("unit", "round", "key", "action", "log_speedup"))
    when = _condition(r, {k: d[k] for k in ("unit", "round", "key", "action")}, name)
    log_speedup = _number(r, d, "log_speedup", f"{name}.log_speedup", 0.0, -MAX_LOG_SPEEDUP,
                          MAX_LOG_SPEEDUP, what="a log speedup")
    requires = d.get("requires", [])
    if not isinstance(requires, list):
        raise r.fail_kind(f"{name}.requires", "a list of decisions", requires)
    return Effect(when, log_speedup,
                  tuple(_condition(r, c, f"{name}.requires[{i}]") for i, c in enumerate(requires)))


PROGRAM_KEYS = ("run_s", "compile_s", "count_s", "cpu_share", "layout_sd", "effects", "hot_share",
                "planted_heat", "heat")


def _heat(r: Reader, data: Any, name: str, base: tuple[tuple[str, float], ...]
          ) -> tuple[tuple[str, float], ...]:
    if data is None:
        return base
    if not isinstance(data, dict):
        raise r.fail_kind(name, "a mapping of function names to weights", data)
    out = []
    for f, w in sorted(data.items()):
        r.string(f, name)
        if not finite_number(w) or w < 0:
            raise r.fail(f"{name}.{f}", "a weight from 0", w)
        out.append((f, float(w)))
    return tuple(out)


MAX_SAMPLES = 100_000  # measured compile times in one list


def _compile_time(r: Reader, data: Any, name: str, base: CompileTime) -> CompileTime:
    """``compile_s``: seconds, ``{mean, cv}`` (a lognormal) or a list of measured seconds."""
    if data is None:
        return base
    if isinstance(data, dict):
        d = r.mapping(data, name, ("mean", "cv"), ("mean",))
        return CompileTime(
            mean_s=_number(r, d, "mean", f"{name}.mean", 0.0, 0, MAX_SECONDS, what="seconds"),
            cv=_number(r, d, "cv", f"{name}.cv", 0.0, 0, 10,
                       what="a coefficient of variation"))
    if isinstance(data, list):
        if not data or len(data) > MAX_SAMPLES:
            raise r.error(name, f"expected 1 to {MAX_SAMPLES} measured seconds, got "
                                f"{len(data)}")
        for i, v in enumerate(data):
            if not finite_number(v) or not 0 <= v <= MAX_SECONDS:
                raise r.fail(f"{name}[{i}]", f"seconds from 0 to {MAX_SECONDS:g}", v)
        samples = tuple(float(v) for v in data)
        return CompileTime(mean_s=sum(samples) / len(samples), samples=samples)
    return CompileTime(mean_s=_number(r, {"s": data}, "s", name, 0.0, 0, MAX_SECONDS,
                                      what="seconds, {mean, cv} or a list of seconds"))


def _program(r: Reader, data: Any, name: str, base: ProgramModel) -> ProgramModel:
    d = r.mapping({} if data is None else data, name, PROGRAM_KEYS, ())
    effects = d.get("effects", [])
    if not isinstance(effects, list):
        raise r.fail_kind(f"{name}.effects", "a list of effects", effects)
    return ProgramModel(
        run_s=_number(r, d, "run_s", f"{name}.run_s", base.run_s, 0, MAX_SECONDS, True,
                      "seconds"),
        compile_s=_compile_time(r, d.get("compile_s"), f"{name}.compile_s", base.compile_s),
        count_s=_number(r, d, "count_s", f"{name}.count_s", base.count_s, 0, MAX_SECONDS,
                        what="seconds"),
        cpu_share=_number(r, d, "cpu_share", f"{name}.cpu_share", base.cpu_share, 0, 1, True,
                          "a CPU share"),
        layout_sd=_number(r, d, "layout_sd", f"{name}.layout_sd", base.layout_sd, 0, 1),
        effects=tuple(_effect(r, e, f"{name}.effects[{i}]") for i, e in enumerate(effects)),
        hot_share=_number(r, d, "hot_share", f"{name}.hot_share", base.hot_share, 0, 1,
                          what="a share"),
        planted_heat=_number(r, d, "planted_heat", f"{name}.planted_heat", base.planted_heat,
                             0, 0.9, what="a share"),
        heat=_heat(r, d.get("heat"), f"{name}.heat", base.heat))


def _program_name(r: Reader, key: str, name: str) -> str:
    """The benchmark a ``programs`` key models, by the name its binaries carry: a bundled
    benchmark's name, or the path of a benchmark directory of one's own (relative to the
    file); anything else would model nothing, silently."""
    from dispatcher.build.manifest import (
        BUNDLED_DIR,
        MANIFEST_NAME,
        ManifestError,
        is_benchmark_path,
        load_benchmark,
    )
    if not is_benchmark_path(key):
        if (BUNDLED_DIR / key / MANIFEST_NAME).is_file():
            return key
        raise r.error(name, "no bundled benchmark of that name (a benchmark directory of "
                      "one's own is given by its path: ./NAME)")
    try:
        return load_benchmark(r.local_path(key, name, "a benchmark directory")).name
    except ManifestError as exc:
        raise r.error(name, f"not a benchmark directory ({' '.join(str(exc).split())})") \
            from None


def parse_model(data: Any, r: Reader, name: str = "model") -> Model:
    """A model from its mapping (YAML or JSON); ``r`` makes the one-line errors, each key
    named under ``name``."""
    d = r.mapping({} if data is None else data, name,
                  ("seed", "noise", "default", "programs"), ())
    prefix = f"{name}." if name else ""
    seed = d.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or abs(seed) > MAX_SEED:
        raise r.fail(f"{prefix}seed", f"an integer from -{MAX_SEED} to {MAX_SEED}", seed)
    n = r.mapping({} if d.get("noise") is None else d["noise"], f"{prefix}noise",
                  ("cv", "disturbed", "disturbed_share", "lost", "job_overhead_s"), ())
    base = Noise()
    noise = Noise(
        cv=_number(r, n, "cv", f"{prefix}noise.cv", base.cv, 0, 1,
                   what="a coefficient of variation"),
        disturbed=_number(r, n, "disturbed", f"{prefix}noise.disturbed", base.disturbed, 0,
                          0.9, what="a probability"),
        disturbed_share=_number(r, n, "disturbed_share", f"{prefix}noise.disturbed_share",
                                base.disturbed_share, 0, 1, True, "a CPU share"),
        lost=_number(r, n, "lost", f"{prefix}noise.lost", base.lost, 0, 0.5,
                     what="a probability"),
        job_overhead_s=_number(r, n, "job_overhead_s", f"{prefix}noise.job_overhead_s",
                               base.job_overhead_s, 0, 60, what="seconds"))
    default = _program(r, d.get("default"), f"{prefix}default", ProgramModel())
    programs_raw = {} if d.get("programs") is None else d["programs"]
    if not isinstance(programs_raw, dict):
        raise r.fail_kind(f"{prefix}programs", "a mapping of benchmark names", programs_raw)
    programs = {}
    for bench, spec in programs_raw.items():
        r.string(bench, f"{prefix}programs")
        programs[_program_name(r, bench, f"{prefix}programs.{bench}")] = \
            _program(r, spec, f"{prefix}programs.{bench}", default)
    return Model(programs=MappingProxyType(programs), default=default, noise=noise, seed=seed)
