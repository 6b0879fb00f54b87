"""Hot code: which functions of a binary ran, and which call sites can change them.

The agent samples the baseline binary's instruction pointer (software ``cpu-clock``, no
hardware counters needed) and returns samples per offset in the binary's file.  Here those
offsets become OCaml functions through the ELF symbol table.  A call site's heat is the
samples of two functions: the one its code lives in (the innermost declaration, ``D`` frame,
of its key, or its unit's top-level code when it has none; inlined bodies are compiled into
that function, so the frame is right whatever was inlined above the site), and its callee
(a call run once, from cold code, may hand a closure to a hot loop that inlining would
specialise).

The resolution is a function, not an instruction: a site in a hot function may itself be on a
cold path.  What it tells for sure is the other side: when neither function got a sample, the
call (nearly) never ran and what it calls took no time, so flipping it can only move code
around.  Copies of one function (functor applications, specialisations) share a name and so
share their samples.
"""
from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path

from dispatcher.core.jobs import RunJob
from dispatcher.core.records import HotFunctions, RunResult, SampleProfile
from dispatcher.core.sites import site_function
from dispatcher.core.tree import Located

# Samples wanted from a profile run: enough to see any function above ~0.5% of the time.
TARGET_SAMPLES = 2000
# Share of flips left to sites in code that never ran (``focus_weights``).
COLD_SHARE = 0.05
RUNTIME = "(runtime)"  # samples in the binary outside OCaml functions (GC, C stubs)

_ESCAPE = re.compile(r"\$([0-9a-fA-F]{2})")
_MARKERS = frozenset(("code_begin", "code_end", "data_begin", "data_end", "frametable",
                      "gc_roots"))


def period_for(wall_s: float) -> int:
    """The sampling period (ns of CPU time) that gives ``TARGET_SAMPLES`` over a run of
    ``wall_s`` seconds, within the agent's limits."""
    return int(min(max(wall_s * 1e9 / TARGET_SAMPLES, 20_000), 1e9))


def profile_job(job: RunJob, wall_s: float) -> RunJob:
    """``job`` (a timing job of the binary) as one sampled run, for a binary whose runs take
    about ``wall_s`` seconds; its runs are stored apart from timings (its own key)."""
    return replace(job, runs=1, perf=False, profile_period_ns=period_for(wall_s))


def hot_functions_of(binary: Path, results: Iterable[RunResult]) -> HotFunctions:
    """The profile of ``binary`` from the results of its ``profile_job``, with the slot that
    took it (and any that lost the job before it)."""
    results = list(results)
    hot = hot_functions(binary, [rec.profile for r in results for rec in r.records
                                 if rec.profile is not None])
    if not results:
        return hot
    return hot.model_copy(update={"worker": results[-1].worker,
                                  "lost_on": tuple(x for r in results for x in r.lost_on)})


def demangle(symbol: str) -> str | None:
    """``camlStdlib__Array__fold_left_123`` -> ``Stdlib__Array.fold_left``;
    ``camlMain__anon_fn$5bmain$2eml$3a12...$5d_77`` -> ``Main.anon_fn[main.ml:12...]``;
    ``camlMain__entry`` (top-level code) -> ``Main.entry``.  None for anything else (C code,
    the runtime, OCaml's section markers)."""
    if not symbol.startswith("caml") or "__" not in symbol:
        return None
    body = symbol[len("caml"):]
    module, _, rest = body.rpartition("__")
    # a module path holds "__" (Stdlib__Array), a function name rarely does: the last "__"
    # that leaves a plausible module (capitalised) splits them
    if not module or not module[0].isupper():
        return None
    stamp = re.match(r"^(?P<name>.+?)_\d+$", rest)
    name = stamp.group("name") if stamp else rest
    if name in _MARKERS:
        return None
    name = _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), name)
    return f"{module}.{name}"


class SymbolTable:
    """An ELF binary's code symbols, to name the function holding a file offset."""

    def __init__(self, binary: Path):
        from elftools.elf.elffile import ELFFile  # imported when a profile is read
        from elftools.elf.sections import SymbolTableSection
        with open(binary, "rb") as f:
            elf = ELFFile(f)
            self._loads = [(seg["p_offset"], seg["p_filesz"], seg["p_vaddr"])
                           for seg in elf.iter_segments() if seg["p_type"] == "PT_LOAD"]
            symbols: dict[int, str] = {}
            symtab = elf.get_section_by_name(".symtab")
            for sym in (symtab.iter_symbols() if isinstance(symtab, SymbolTableSection)
                        else ()):
                if sym["st_shndx"] == "SHN_UNDEF" or sym["st_info"]["type"] in (
                        "STT_SECTION", "STT_FILE", "STT_OBJECT"):
                    continue
                address = sym["st_value"]
                name = sym.name
                # at one address, an OCaml function wins over a marker or a C label
                if address not in symbols or demangle(symbols[address]) is None:
                    symbols[address] = name
        self._addresses = sorted(symbols)
        self._names = [symbols[a] for a in self._addresses]

    def address(self, offset: int) -> int | None:
        """The virtual address of a file offset (None: outside every loaded segment)."""
        for start, size, vaddr in self._loads:
            if start <= offset < start + size:
                return vaddr + offset - start
        return None

    def function(self, offset: int) -> str:
        """The OCaml function (``Module.name``) holding file offset ``offset``, or RUNTIME."""
        address = self.address(offset)
        i = bisect.bisect_right(self._addresses, address) - 1 if address is not None else -1
        if i < 0:
            return RUNTIME
        return demangle(self._names[i]) or RUNTIME


def hot_functions(binary: Path, profiles: Iterable[SampleProfile]) -> HotFunctions:
    """The samples of ``profiles`` (runs of ``binary``) summed per OCaml function."""
    table: SymbolTable | None = None
    functions: dict[str, int] = {}
    samples = lost = elsewhere = 0
    errors: list[str] = []
    period = 0
    for p in profiles:
        if p.error is not None:
            errors.append(p.error)
            continue
        if not p.mapped:
            errors.append("the binary's mapping was not seen")
            continue
        period = p.period_ns
        samples += p.samples
        lost += p.lost
        elsewhere += p.elsewhere
        if table is None:
            table = SymbolTable(binary)
        for hex_offset, n in p.offsets.items():
            name = table.function(int(hex_offset, 16))
            functions[name] = functions.get(name, 0) + n
    if not functions and errors:
        return HotFunctions(error=errors[0])
    return HotFunctions(period_ns=period, samples=samples, lost=lost, elsewhere=elsewhere,
                        functions=dict(sorted(functions.items())))


def site_heat(unit: str, key: str, callee: str, hot: HotFunctions) -> int:
    """Samples of the function holding the call ``key`` of ``unit`` plus those of its
    ``callee`` (0: the call never ran while sampled, and nor did what it calls)."""
    where = site_function(unit, key)
    heat = hot.functions.get(where, 0)
    if callee != where:
        heat += hot.functions.get(callee, 0)
    return heat


def site_samples(sites: Sequence[Located], hot: HotFunctions) -> list[int]:
    """``site_heat`` of each site."""
    return [site_heat(u, n.key, n.name, hot) for u, _, n in sites]


def focus_weights(samples: Sequence[int], cold_share: float = COLD_SHARE) -> list[float] | None:
    """Selection weights for sites with these sample counts, or None for uniform.

    Sites in code that ran share ``1 - cold_share`` of the weight: half of it evenly, half in
    proportion to their function's samples (a hot function's sites come first, yet a site in a
    lukewarm one is still tried); sites in code that never ran share ``cold_share`` evenly, so
    the search can still find what layout alone does.  Uniform when every site, or none, ran.
    """
    hot = [s for s in samples if s > 0]
    cold = len(samples) - len(hot)
    if not hot or not cold and len(set(hot)) == 1:
        return None
    total = sum(hot)
    hot_mass = 1.0 if cold == 0 else 1.0 - cold_share
    weights = []
    for s in samples:
        if s > 0:
            weights.append(hot_mass * (0.5 / len(hot) + 0.5 * s / total))
        else:
            weights.append(cold_share / cold)
    return weights


def in_cold_code(unit: str, key: str, callee: str, hot: HotFunctions) -> bool:
    """Whether the call ``key`` of ``unit`` (to ``callee``) never ran while sampled."""
    return site_heat(unit, key, callee, hot) == 0
