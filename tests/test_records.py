"""The experiment record: golden rundirs (versions 1, 2, and 4 of an asynchronous search)
read, round-tripped and resumed; versions checked; docs/rundir-format.md in step with the
types."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dispatcher.core import records
from dispatcher.core.outputs import OUTPUTS
from dispatcher.core.records import (
    BaselineEvent,
    FinishEvent,
    ProposeEvent,
    RecordError,
    RemeasureEvent,
    ResumeEvent,
    RunResult,
    StartEvent,
    StepEvent,
    read_experiment,
    results_from_json,
)
from dispatcher.core.rundir import Rundir, RundirError, read_batch_log, read_journal
from dispatcher.search.rules import backlog
from tests.helpers import GOLDEN, REPO, V1, V2, invoke, one_line_error, relocated

V4 = GOLDEN / "rundir-v4"  # an asynchronous search (search.mode: async) of tinysum


def journal_lines(rundir: Path) -> list[dict]:
    return [json.loads(line) for line in (rundir / "journal.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("rundir", [V1, V2], ids=["v1", "v2"])
def test_golden_journal_reads_as_typed_events(rundir):
    events = read_journal(rundir / "journal.jsonl")
    kinds = [type(e) for e in events]
    assert kinds[0] is StartEvent and kinds[1] is BaselineEvent and kinds[-1] is FinishEvent
    assert [e.step for e in events if isinstance(e, StepEvent)] == [1, 2, 3, 4]
    assert any(isinstance(e, RemeasureEvent) for e in events)
    for e in events:
        if isinstance(e, StepEvent):
            assert e.candidates and all(c.dir == records.candidate_dir(e.step, c.candidate)
                                        for c in e.candidates)
    baseline = next(e for e in events if isinstance(e, BaselineEvent))
    assert baseline.dir == records.BASELINE_DIR
    results = Rundir.read_measurements(rundir / baseline.dir)
    assert sum(len(r.records) for r in results) == len(baseline.times) == 3


def test_golden_v2_round_trips_exactly():
    """Every record written by version 2 reads back and writes out to the same JSON."""
    for line in journal_lines(V2):
        event = records.event_from_json(line, "journal")
        assert event.to_json() == line
    experiment = json.loads((V2 / "experiment.json").read_text())
    assert read_experiment(V2 / "experiment.json").to_json() == experiment
    for path in sorted(V2.glob("steps/*/*/measurements.json")):
        data = json.loads(path.read_text())
        assert [r.to_json() for r in results_from_json(data, str(path))] == data, path
    state = json.loads((V2 / "state.json").read_text())
    assert records.SearchState.from_json(state).to_json() == state


def test_golden_v2_keeps_everything_the_agent_measured():
    (result,) = Rundir.read_measurements(V2 / records.BASELINE_DIR)
    assert result.worker_class == "local" and result.cpu >= 0
    for rec in result.records:
        assert rec.cpus_allowed == str(result.cpu)  # the run was pinned where it says
        assert rec.stdout_sha256 and len(rec.stdout_sha256) == 64 and rec.stdout_bytes
        assert rec.gc and all(isinstance(v, int) for k, v in rec.gc.items()
                              if k.endswith("collections"))
    assert read_experiment(V2 / "experiment.json").worker_class == "local"


def test_golden_v1_reads_with_defaults():
    experiment = read_experiment(V1 / "experiment.json")
    assert experiment.version == 1 and experiment.worker_class is None
    (result,) = Rundir.read_measurements(V1 / records.BASELINE_DIR)
    assert all(r.cpus_allowed is None and r.stdout_sha256 is None for r in result.records)
    assert [e.version for e in read_batch_log(GOLDEN / "batch.log")] == [None, 2]


def _write_experiment(tmp_path: Path, **changes) -> Path:
    data = {**json.loads((V2 / "experiment.json").read_text()), **changes}
    path = tmp_path / "experiment.json"
    path.write_text(json.dumps({k: v for k, v in data.items() if v is not None}))
    return path


def test_an_unknown_version_or_a_damaged_record_is_one_line_naming_file_and_field(tmp_path):
    path = _write_experiment(tmp_path, version=7)
    with pytest.raises(RecordError, match=r"experiment.json: rundir format version 7 is not one "
                                          r"this tool reads \(1, 2, 3, 4, 5, 6\)$"):
        read_experiment(path)
    path = _write_experiment(tmp_path, steps=None)
    with pytest.raises(RecordError, match=r"experiment.json: steps: Field required$"):
        read_experiment(path)
    path = _write_experiment(tmp_path, algorithm="greedy")
    with pytest.raises(RecordError, match=r"experiment.json: algorithm: Input should be 'sa' "
                                          r"or 'random-walk'$"):
        read_experiment(path)
    path.write_text("{not json")
    with pytest.raises(RecordError, match=r"experiment.json: unreadable"):
        read_experiment(path)
    journal = tmp_path / "journal.jsonl"
    lines = (V2 / "journal.jsonl").read_text().splitlines()
    bad = json.loads(lines[1])
    bad["times"] = "fast"
    journal.write_text("\n".join([lines[0], json.dumps(bad), lines[2]]) + "\n")
    with pytest.raises(RundirError, match=r"journal.jsonl: event 2: baseline.times: Input "
                                          r"should be a valid list$"):
        read_journal(journal)


def test_resume_refuses_a_rundir_of_another_version_with_one_line(tmp_path):
    rundir = tmp_path / "r"
    shutil.copytree(V2, rundir)
    data = json.loads((rundir / "experiment.json").read_text())
    (rundir / "experiment.json").write_text(json.dumps({**data, "version": 9}))
    line = one_line_error(invoke("run_training_experiments", "--resume", str(rundir), cwd=REPO))
    assert line == (f"run_training_experiments: {rundir}/experiment.json: rundir format "
                    "version 9 is not one this tool reads (1, 2, 3, 4, 5, 6)")


# --------------------------------------------------------------------------- the document

def documented_fields() -> dict[str, list[str]]:
    """``## Name`` sections of docs/rundir-format.md -> the backticked names of their table."""
    sections: dict[str, list[str]] = {}
    name = None
    for line in (REPO / "docs" / "rundir-format.md").read_text().splitlines():
        if line.startswith("## "):
            name = line[3:].strip()
            sections[name] = []
        elif name and (m := re.match(r"\| `([a-z0-9_]+)` \|", line)):
            sections[name].append(m.group(1))
    return {name: fields for name, fields in sections.items() if fields}  # prose: no table


def test_the_format_document_lists_exactly_the_fields_of_each_record():
    documented = documented_fields()
    types = {name: getattr(records, name) for name in documented}
    assert set(documented) == {"Experiment", "StartEvent", "BaselineEvent", "StepEvent",
                               "Candidate", "Pointer", "DecisionCounts", "RemeasureEvent",
                               "CanaryEvent", "ConfirmEvent", "ProposeEvent",
                               "ResumeEvent", "FinishEvent", "SearchState", "RunResult",
                               "RunRecord", "PerfCount", "BatchEntry", "SampleProfile",
                               "HotFunctions"}
    for name, fields in documented.items():
        expected = list(types[name].model_fields)
        if name == "StartEvent":  # documented as "every Experiment field" plus its own
            expected = [f for f in expected if f not in records.Experiment.model_fields]
        assert sorted(fields) == sorted(expected), name
    assert set(records.EVENT_TYPES) <= {types[n] for n in documented}


def test_an_experiment_is_its_settings_and_its_identity_and_writes_out_as_read():
    """Version 5 records the run settings and the focus; an older experiment, which lacks
    them, writes out as it was read."""
    v2 = read_experiment(V2 / "experiment.json")
    assert v2.settings() == records.SearchSettings(**{
        f: getattr(v2, f) for f in records.SearchSettings.model_fields})
    assert (v2.timeout, v2.perf, v2.aslr, v2.focus) == (None, None, None, None)
    assert v2.to_json() == json.loads((V2 / "experiment.json").read_text())
    v5 = v2.model_copy(update=dict(version=5, timeout=30.0, perf=False, aslr=False,
                                   focus="uniform"))
    data = v5.to_json()
    assert (data["timeout"], data["perf"], data["aslr"], data["focus"]) == \
        (30.0, False, False, "uniform")
    assert records.Experiment.from_json(data) == v5
    assert set(records.Experiment.model_fields) - set(records.SearchSettings.model_fields) == \
        {"version", "task", "benchmark", "chain", "rundir", "worker_class", "compiler"}


def test_the_format_document_names_the_current_version():
    first = (REPO / "docs" / "rundir-format.md").read_text().splitlines()[0]
    assert first == f"# Rundir format, version {records.FORMAT_VERSION}"


# --------------------------------------------------------------------------- resume

@pytest.mark.parametrize("golden", [V1, V2], ids=["v1", "v2"])
def test_a_golden_rundir_resumes_exactly_with_a_fresh_store(compiler, tmp_path, golden):
    """Step 3 proposes what the original run proposed (state, RNG and trees come from the
    rundir alone); the incumbent is re-measured at step 4 although the store is new (its binary
    is compiled again from its proposal, and is the same)."""
    rundir = relocated(golden, tmp_path, keep_steps=2)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"store": str(tmp_path / "store"),
                                      "local": {"cpus": [max(os.sched_getaffinity(0))]},
                                      "run": {"timeout": 60}}))
    proc = subprocess.run([sys.executable, "-m", "commands", "run_training_experiments",
                           "--config", str(config), "--resume", str(rundir)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    events = Rundir(rundir).events()
    assert [e.step for e in events if isinstance(e, StepEvent)] == [1, 2, 3, 4]
    assert isinstance(events[-1], FinishEvent) and events[-1].reason == "completed"
    assert [e.step for e in events if isinstance(e, RemeasureEvent)][-1] == 4
    # Settings the rundir did not record come from the config, as its version resumed, and
    # the resume event says which (version 1 did not pair either).
    (resume,) = [e for e in events if isinstance(e, ResumeEvent)]
    assert resume.from_config == {"timeout": 60, "perf": True, "aslr": False, "focus": "hot",
                                  **({"max_pairs": 20, "half_width": 0.01}
                                     if golden is V1 else {})}
    for k in (0, 1):
        d = records.candidate_dir(3, k)
        assert (rundir / d / "overrides.sexp").read_text() == \
            (golden / d / "overrides.sexp").read_text()
    results = [r for p in sorted(rundir.glob("steps/00003/c*")) for r in
               Rundir.read_measurements(p)]
    assert all(isinstance(r, RunResult) and r.records[0].cpus_allowed for r in results)


def test_resume_refuses_a_rundir_timed_on_a_worker_class_the_config_lacks(tmp_path):
    """Its candidates would be compared with a baseline timed on other machines."""
    rundir = relocated(V2, tmp_path, keep_steps=2)
    journal = (rundir / "journal.jsonl").read_bytes()
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"store": str(tmp_path / "store"),
                                      "local": {"cpus": [max(os.sched_getaffinity(0))],
                                                "worker_class": "elsewhere"}}))
    line = one_line_error(invoke("run_training_experiments", "--config", str(config),
                                 "--resume", str(rundir), cwd=REPO))
    assert line == (f"run_training_experiments: {rundir}: its runs were timed on worker class "
                    "'local', which this config does not have (elsewhere)")
    assert (rundir / "journal.jsonl").read_bytes() == journal  # nothing appended


def test_golden_v3_profile_round_trips_and_is_what_a_resume_reads(tmp_path):
    """profile.json (version 3), written by a real kahan chain: read back as written, and
    found by the rundir that holds it."""
    golden = GOLDEN / "profile-v3.json"
    data = json.loads(golden.read_text())
    hot = records.HotFunctions.from_json(data, str(golden))
    assert hot.to_json() == data
    assert hot.error is None and hot.samples > 0 and "Summation.add" in hot.functions
    rundir = tmp_path / "r"
    shutil.copytree(V2, rundir)
    assert Rundir(rundir).profile() is None  # version 2: searched with every site alike
    shutil.copyfile(golden, rundir / "profile.json")
    assert Rundir(rundir).profile() == hot
    (rundir / "profile.json").write_text('{"samples": "many"}')
    with pytest.raises(RundirError, match=r"profile.json: samples: Input should be a valid "
                                          r"integer"):
        Rundir(rundir).profile()


# --------------------------------------------------------------------------- version 4: async

def test_golden_v4_async_round_trips_exactly_and_every_proposal_is_judged_once():
    """An asynchronous search's rundir, written by a real run: every record reads back and
    writes out to the same JSON; each proposal is journaled before the step that judges it."""
    lines = journal_lines(V4)
    for line in lines:
        assert records.event_from_json(line, "journal").to_json() == line
    experiment = json.loads((V4 / "experiment.json").read_text())
    assert read_experiment(V4 / "experiment.json").to_json() == experiment
    assert (experiment["version"], experiment["mode"], experiment["in_flight"]) == (4, "async", 2)
    state = json.loads((V4 / "state.json").read_text())
    assert records.SearchState.from_json(state).to_json() == state
    events = read_journal(V4 / "journal.jsonl")
    steps = [e for e in events if isinstance(e, StepEvent)]
    assert [e.step for e in steps] == [1, 2, 3, 4] and sorted(e.proposal for e in steps) == \
        [1, 2, 3, 4]
    log = backlog(events)
    assert log.pending == () and log.next_proposal == 5
    for e in events:
        if isinstance(e, ProposeEvent):
            assert (V4 / e.overrides).is_file()
    # a synchronous rundir of version 4 writes none of the new fields (as version 3 did)
    sync = read_experiment(V2 / "experiment.json").model_copy(update={"version": 4})
    assert "mode" not in sync.to_json() and "in_flight" not in sync.to_json()


def test_golden_v4_async_resumes_exactly_with_a_fresh_store(compiler, tmp_path):
    """Cut just after step 2 (proposal 3 drawn and in flight, 4 not yet): the resume measures
    proposal 3 again from its file, draws proposal 4 as the original run did (the state after
    step 2, its own stream) and judges them as steps 3 and 4 (one slot, one compile job: in
    that order)."""
    rundir = tmp_path / "v4"
    shutil.copytree(V4, rundir)
    data = json.loads((rundir / "experiment.json").read_text())
    data["benchmark"] = str(GOLDEN / "tinysum")
    (rundir / "experiment.json").write_text(json.dumps(data))
    kept = []
    for line in (rundir / "journal.jsonl").read_text().splitlines():
        kept.append(line)
        if json.loads(line)["event"] == "step" and json.loads(line)["step"] == 2:
            break
    (rundir / "journal.jsonl").write_text("\n".join(kept) + "\n")
    for d in (rundir / "steps").iterdir():
        if int(d.name) > 2:
            shutil.rmtree(d)
    (rundir / records.proposal_file(4)).unlink()
    assert [e.proposal for e in backlog(Rundir(rundir).events()).pending] == [3]
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"store": str(tmp_path / "store"),
                                      "local": {"cpus": [max(os.sched_getaffinity(0))]},
                                      "compile": {"jobs": 1}, "run": {"timeout": 60}}))
    proc = subprocess.run([sys.executable, "-m", "commands", "run_training_experiments",
                           "--config", str(config), "--resume", str(rundir)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    events = Rundir(rundir).events()
    golden = read_journal(V4 / "journal.jsonl")
    assert [e.step for e in events if isinstance(e, StepEvent)] == [1, 2, 3, 4]
    assert [(e.step, e.proposal) for e in events if isinstance(e, StepEvent)] == \
        [(e.step, e.proposal) for e in golden if isinstance(e, StepEvent)]
    assert [e.model_dump(exclude={"time"}) for e in events if isinstance(e, ProposeEvent)] == \
        [e.model_dump(exclude={"time"}) for e in golden if isinstance(e, ProposeEvent)]
    for n in (3, 4):
        d = records.candidate_dir(n, 0)
        assert (rundir / d / "overrides.sexp").read_text() == \
            (V4 / d / "overrides.sexp").read_text() == \
            (V4 / records.proposal_file(n)).read_text()
        # a rundir keeps the layout of the version it began with: plain dumps, as in V4's
        assert not (rundir / d / OUTPUTS).exists()
        assert sorted(p.name for p in (rundir / d).glob("*.decisions.sexp")) == \
            sorted(p.name for p in (V4 / d).glob("*.decisions.sexp"))
    assert isinstance(events[-1], FinishEvent) and events[-1].reason == "completed"
    (resume,) = [e for e in events if isinstance(e, ResumeEvent)]
    assert resume.from_config == {"timeout": 60, "perf": True, "aslr": False, "focus": "hot"}


def test_resume_refuses_a_rundir_made_by_another_compiler(compiler, tmp_path):
    """Its baseline and candidates would be one compiler's binaries, its new steps another's."""
    rundir = relocated(V2, tmp_path, keep_steps=2)
    data = json.loads((rundir / "experiment.json").read_text())
    (rundir / "experiment.json").write_text(json.dumps({**data, "compiler": "ab" * 32}))
    journal = (rundir / "journal.jsonl").read_bytes()
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"store": str(tmp_path / "store"),
                                      "local": {"cpus": [max(os.sched_getaffinity(0))]}}))
    line = one_line_error(invoke("run_training_experiments", "--config", str(config),
                                 "--resume", str(rundir), cwd=REPO))
    assert line == (
        f"run_training_experiments: {rundir}: its candidates were compiled by compiler "
        "abababababababab, not by "
        f"this one ({compiler.identity[:16]}, {compiler.prefix}): resume it with that compiler "
        "($INLINING_COMPILER_PREFIX=<its prefix>)")
    assert (rundir / "journal.jsonl").read_bytes() == journal  # nothing appended


def test_a_journal_is_read_incrementally_as_read_journal_reads_it(tmp_path):
    """Rundir.events reads only what was appended since (``JournalReader``): each event parsed
    once however often the journal is asked for (a re-measurement every few steps was
    quadratic in the steps), the same events as ``read_journal`` at every point, a torn
    tail left out until it is whole, a corrupt line the same error, a rewritten journal
    read again."""
    from dispatcher.core.records import FinishEvent, ResumeEvent, event_from_json
    from dispatcher.core.rundir import JournalReader
    path = tmp_path / "journal.jsonl"
    parsed: list[str] = []

    def counted(data, where):
        parsed.append(where)
        return event_from_json(data, where)

    reader = JournalReader(path, counted)
    assert reader.events() == []
    lines = [json.dumps({**ResumeEvent(from_step=i).to_json(), "time": 1.0}) for i in range(40)]
    for line in lines:
        with open(path, "a") as f:
            f.write(line + "\n")
        assert reader.events() == read_journal(path)
    assert len(parsed) == 40  # each line once, not once per read
    torn = json.dumps({**FinishEvent(reason="completed").to_json(), "time": 2.0})
    with open(path, "a") as f:
        f.write(torn[:10])
    assert reader.events() == read_journal(path) and len(reader.events()) == 40
    with open(path, "a") as f:
        f.write(torn[10:] + "\n\n")
    assert reader.events() == read_journal(path) and len(reader.events()) == 41
    with open(path, "a") as f:
        f.write("not json\n")
    for read in (reader.events, lambda: read_journal(path)):
        with pytest.raises(RundirError, match=r"journal.jsonl:43: corrupt journal line"):
            read()
    path.write_text(lines[0] + "\n")  # replaced (a new file): read again whole
    assert reader.events() == read_journal(path) and len(reader.events()) == 1
    other = json.dumps({**ResumeEvent(from_step=99).to_json(), "time": 3.0})
    path.write_text(other + "\n" + lines[1] + "\n")  # rewritten in place, longer
    assert reader.events() == read_journal(path) and reader.events()[0].from_step == 99
