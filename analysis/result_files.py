"""The CSV files of ``results/``: a comparison of a build with the heuristic written as its
paired run times per worker (README.md, "results/").

Shared by ``run-all-benchmarks`` (optimal trees) and ``run-plugin-benchmark`` (policies), so
both write one layout; ``summary_rows`` is the table ``run-plugin-benchmark --baselines`` writes
beside them (``<results>/plugin_<policy>.summary.csv``).
"""
from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path

from dispatcher.core.comparison import Comparison
from dispatcher.core.figures import Figure
from dispatcher.core.files import atomic_output

HEURISTIC = "heuristic"  # the overrides column of the heuristic's paired runs


def pairs_by_worker(c: Comparison) -> dict[str, tuple[list[float], list[float]]]:
    """The comparison's pairs by the slot they ran on: worker -> (reference times, candidate
    times), in the order they ran.  The pairs are matched to the rounds of ``c.results``
    (reference, candidate, candidate, reference, every run of a round on one slot); any pair no
    round accounts for is put on ``c.worker``, the slot of the last pairs."""
    expected = list(zip(c.reference_times, c.candidate_times))
    out: dict[str, tuple[list[float], list[float]]] = {}
    i = 0
    rs = c.results
    for k in range(0, len(rs) - len(rs) % 4, 4):
        r1, c1, c2, r2 = rs[k:k + 4]
        if len({r.worker for r in (r1, c1, c2, r2)}) != 1:
            continue
        for ref, cand in ((r1, c1), (r2, c2)):
            if i < len(expected) and ref.times and cand.times \
                    and (ref.times[0], cand.times[0]) == expected[i]:
                refs, cands = out.setdefault(ref.worker, ([], []))
                refs.append(ref.times[0])
                cands.append(cand.times[0])
                i += 1
    for ref_t, cand_t in expected[i:]:
        refs, cands = out.setdefault(c.worker or "-", ([], []))
        refs.append(ref_t)
        cands.append(cand_t)
    return out


def csv_rows(c: Comparison, overrides: str, rundirs: tuple[str, ...]) -> list[list[str]]:
    """The header and, per worker, a line of the optimal tree's paired run times and one of
    the heuristic's (README.md, "results/"); under an exact metric, the one counted value of
    each, in a column named after the metric (``instructions``, ``cycles``)."""
    if c.metric != "time":
        def value(v: list[float]) -> list[str]:
            return [format(x, ".15g") for x in v]
        worker = c.worker or "-"
        return [["worker", "overrides", "rundirs", c.metric],
                [worker, overrides, ";".join(rundirs), *value(c.candidate_times)],
                [worker, HEURISTIC, "", *value(c.reference_times)]]
    by_worker = pairs_by_worker(c) or {c.worker or "-": ([], [])}
    longest = max(len(cands) for _, cands in by_worker.values())
    rows = [["worker", "overrides", "rundirs", *(f"run_{i + 1}" for i in range(longest))]]
    for worker, (refs, cands) in by_worker.items():
        for label, source, times in ((overrides, ";".join(rundirs), cands),
                                     (HEURISTIC, "", refs)):
            cells = [f"{t:.6f}" for t in times]
            rows.append([worker, label, source, *cells, *[""] * (longest - len(cells))])
    return rows


def write_csv(path: Path, rows: list[list[str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(path) as tmp:
        with open(tmp, "w", newline="") as f:
            csv.writer(f, lineterminator="\n").writerows(rows)
    return path


SUMMARY_HEADER = ["benchmark", "split", "build", "speedup", "low", "high", "pairs",
                  "size_ratio", "policy_vs", "policy_vs_low", "policy_vs_high", "metric",
                  "counted", "note"]


def summary_rows(lines: Iterable[tuple[str, str, str, Figure, Figure | None, Figure | None,
                                       str | None]]) -> list[list[str]]:
    """The header and one row per (benchmark, split, build, its figure, the policy against
    it, its figure as the split's geometric mean counts it, a note): the build's speedup
    against the heuristic, its pairs and size ratio, and the policy's speedup over that build
    (empty on the policy's own row and where either has no figure), the metric the figure is
    in (``time``, or an exact one: its low = high), the speedup the means count (a baseline
    whose build failed: 1, the heuristic's figure) and why it differs, or which baseline the
    ``oracle`` row took (``dispatcher.baselines.table_cells``)."""
    def num(x: float | None) -> str:
        return "" if x is None else f"{x:.6f}"
    rows = [list(SUMMARY_HEADER)]
    for bench, split, build, m, vs, counted, note in lines:
        rows.append([bench, split, build, num(m.speedup), num(m.low), num(m.high),
                     str(m.pairs), num(m.size_ratio),
                     *((num(vs.speedup), num(vs.low), num(vs.high)) if vs is not None
                       else ("", "", "")), m.metric,
                     num(counted.speedup if counted is not None else None), note or ""])
    return rows
