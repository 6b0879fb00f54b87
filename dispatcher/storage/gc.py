"""Store garbage collection: keep what rundirs still need, remove the rest.

A store grows by about 2 MB per candidate, nearly all of it the binary.  Rundirs name the
candidates they use by compile key (``artifact`` in the baseline, step and pointer records),
and everything a compiled entry holds can be made again from a rundir (its ``overrides.sexp``
compiles to the same binary), so the store is a cache and collecting it loses no data:

- measurements and comparisons (small JSON) are kept, all of them;
- a compiled entry named by a rundir keeps its meta and packed outputs; its binary stays only
  where a later step of that rundir may run it: the baseline, incumbent and best of a rundir
  that has not finished (``--resume`` compares against them at once); other binaries are
  compiled again if ever needed;
- compiled entries no rundir names (e.g. run-benchmark's), unit entries (the incremental
  compile cache, refilled by the next compiles), the local agents' binary cache, the
  remembered compile failures (so a candidate that failed is compiled again: after a
  compiler fix, or on a quieter machine for one that ran past the build budget) and what
  killed writers left are removed.

It runs only while no other process has the store open (its lock held alone), so nothing it
removes is in use.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from dispatcher.core.records import BaselineEvent, FinishEvent, StepEvent
from dispatcher.core.rundir import JOURNAL, RundirError, SitesRundir, read_journal
from dispatcher.core.site_records import ReferenceEvent, is_sites_rundir
from dispatcher.storage.store import Store, StoreError, disk_usage


@dataclass
class Needs:
    """What the rundirs read still need: compiled entries, and those of them whose binary
    stays.  ``notes``: one line per rundir that could not be read (it protects nothing)."""

    entries: set[str] = field(default_factory=set)
    binaries: set[str] = field(default_factory=set)
    rundirs: int = 0
    notes: list[str] = field(default_factory=list)


def needs_of(rundirs: Iterable[Path]) -> Needs:
    """What ``rundirs`` need kept (the rundirs a batch log lists: ``rundirs_of_batch_log``)."""
    needs = Needs()
    for rundir in rundirs:
        journal = rundir / JOURNAL
        if not journal.is_file():
            needs.notes.append(f"{rundir}: no journal (a rundir removed or never started); "
                               "skipped")
            continue
        if is_sites_rundir(rundir):  # a labels rundir: every tree compiles again at once
            try:
                events = SitesRundir(rundir).events()
            except RundirError as exc:
                needs.notes.append(str(exc))
                continue
            needs.rundirs += 1
            needs.entries.update(e.artifact or "" for e in events
                                 if isinstance(e, ReferenceEvent))
            continue
        try:
            events = read_journal(journal)
        except RundirError as exc:
            needs.notes.append(f"{exc}; its candidates will be compiled again if resumed")
            continue
        needs.rundirs += 1
        baseline = last = None
        for e in events:
            if isinstance(e, BaselineEvent):
                baseline = e
                needs.entries.add(e.artifact or "")
            elif isinstance(e, StepEvent):
                last = e
                needs.entries.update(c.artifact or "" for c in e.candidates)
                needs.entries.update((e.incumbent.artifact or "", e.best.artifact or ""))
        finished = bool(events) and isinstance(events[-1], FinishEvent) \
            and events[-1].reason == "completed"
        if not finished:
            if baseline is not None:
                needs.binaries.add(baseline.artifact or "")
            if last is not None:
                needs.binaries.update((last.incumbent.artifact or "",
                                       last.best.artifact or ""))
    needs.entries.discard("")
    needs.binaries.discard("")
    return needs


@dataclass
class Collected:
    before: int  # bytes the store took on disk
    after: int
    kept: int = 0  # compiled entries kept
    kept_binaries: int = 0
    entries: int = 0  # compiled entries removed
    binaries: int = 0  # binaries removed from kept entries
    units: int = 0
    worker_cache: int = 0
    failures: int = 0  # remembered compile failures forgotten
    leftovers: int = 0  # staging directories and temporary files of killed writers


def collect(root: Path, needs: Needs, keep_units: bool = False) -> Collected:
    """Remove from the store at ``root`` what ``needs`` does not name (module docstring).
    StoreError (one line) if there is no store there or another process has it open."""
    if not (root / "compiled").is_dir():
        raise StoreError(f"{root}: no store there")
    store = Store(root)
    try:
        if not store.try_exclusive():
            raise StoreError(f"{root}: the store is in use by a running command (a master, "
                             "run-benchmark); collect it once that has finished")
        report = Collected(before=disk_usage(store.root), after=0)
        report.leftovers = store.sweep()[0]
        for key in store.artifact_keys():
            if key not in needs.entries:
                store.drop_artifact(key)
                report.entries += 1
                continue
            report.kept += 1
            store.repack_artifact(key)  # an entry of an earlier version: compressed now
            if not store.has_binary(key):
                continue
            if key in needs.binaries:
                report.kept_binaries += 1
            else:
                store.drop_binary(key)
                report.binaries += 1
        for key in store.unit_keys():
            if keep_units:
                store.repack_unit(key)
            else:
                store.drop_unit(key)
                report.units += 1
        for path in store.worker_cache.iterdir():  # hard links: relinked when a job needs one
            path.unlink()
            report.worker_cache += 1
        for key in store.failure_keys():
            store.drop_failure(key)
            report.failures += 1
        _remove_empty_fans(store)
        report.after = disk_usage(store.root)
        return report
    finally:
        store.close()


def _remove_empty_fans(store: Store) -> None:
    for area in (store.compiled, store.units, store.measurements, store.failures):
        if not area.is_dir():
            continue
        for fan in area.iterdir():
            try:
                fan.rmdir()  # only if empty
            except OSError:
                pass
