"""dispatcher.core.files.atomic_output and the writers built on it (export table, plot)."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pandas as pd
import pytest
from matplotlib.figure import Figure

from analysis.export import write_table
from dispatcher.core.files import atomic_output


def listing(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


class Boom(Exception):
    pass


def test_success_replaces_the_target(tmp_path):
    out = tmp_path / "table.csv"
    out.write_text("old\n")
    with atomic_output(out) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".table.csv.")
        assert tmp.suffix == ".csv" and tmp.exists() and tmp.stat().st_size == 0
        assert out.read_text() == "old\n"  # nothing visible before the block ends
        tmp.write_text("new\n")
    assert out.read_text() == "new\n"
    assert listing(tmp_path) == ["table.csv"]


def test_through_a_file_object_and_a_chosen_suffix(tmp_path):
    out = tmp_path / "data.bin"
    with atomic_output(out, suffix=".part") as tmp, open(tmp, "wb") as f:
        assert tmp.name.endswith(".part")
        f.write(b"\x00\x01")
    assert out.read_bytes() == b"\x00\x01"
    assert listing(tmp_path) == ["data.bin"]


def test_a_new_file_gets_the_umask_permissions(tmp_path):
    old = os.umask(0o027)
    try:
        with atomic_output(tmp_path / "x.txt") as tmp:
            tmp.write_text("x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "x.txt").stat().st_mode) == 0o640


@pytest.mark.parametrize("error", [Boom, KeyboardInterrupt])
def test_failure_keeps_the_old_file_and_leaves_no_temporary(tmp_path, error):
    out = tmp_path / "plot.png"
    out.write_bytes(b"old picture")
    with pytest.raises(error):
        with atomic_output(out) as tmp:
            tmp.write_bytes(b"half a pict")
            raise error()
    assert out.read_bytes() == b"old picture"
    assert listing(tmp_path) == ["plot.png"]


def test_failure_without_an_old_file_creates_nothing(tmp_path):
    with pytest.raises(Boom):
        with atomic_output(tmp_path / "new.csv") as tmp:
            tmp.write_text("partial")
            raise Boom()
    assert listing(tmp_path) == []


def test_missing_directory_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        with atomic_output(tmp_path / "nope" / "x.csv"):
            pass


def test_write_table_failure_keeps_the_old_export(tmp_path, monkeypatch):
    out = tmp_path / "runs.csv"
    write_table(pd.DataFrame({"a": [1, 2]}), out)
    assert out.read_text() == "a\n1\n2\n"

    def broken_to_csv(self, path, **kwargs):
        Path(path).write_text("a\n3\n")  # part of a table, then the disk fills up
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_csv", broken_to_csv)
    with pytest.raises(OSError):
        write_table(pd.DataFrame({"a": [3, 4]}), out)
    assert out.read_text() == "a\n1\n2\n"
    assert listing(tmp_path) == ["runs.csv"]


def test_plot_failure_keeps_the_old_plot(tmp_path, monkeypatch):
    # Only the plot's last act matters here (savefig fails): an empty journal will do.
    from analysis import plots

    rundir = tmp_path / "rundir"
    rundir.mkdir()
    (rundir / "plot.png").write_bytes(b"old plot")
    monkeypatch.setattr(plots, "read_journal", lambda path: [])

    def broken_savefig(self, fname, **kwargs):
        Path(fname).write_bytes(b"\x89PNG half")
        raise RuntimeError("renderer crashed")

    monkeypatch.setattr(Figure, "savefig", broken_savefig)
    with pytest.raises(RuntimeError, match="renderer crashed"):
        plots.plot_experiment(rundir)
    assert (rundir / "plot.png").read_bytes() == b"old plot"
    assert listing(rundir) == ["plot.png"]


def test_run_records_are_written_a_record_a_line_and_read_as_they_were():
    """records_json (the files of runs) and json_text_with (a head around runs serialised
    once): the same values as json_text's, a record on each line, nested runs indented."""
    import json

    from dispatcher.core.comparison import Comparison
    from dispatcher.core.files import json_text, json_text_with, records_json
    from dispatcher.core.records import RunResult

    assert records_json([]) == "[]" and json.loads(records_json([])) == []
    runs = [{"b": [1, 2.5, None], "a": {"z": "x\ny", "y": float("1e-5")}}, {"c": True}]
    text = records_json(runs)
    assert json.loads(text) == runs
    assert text.splitlines() == ["[", json.dumps(runs[0], sort_keys=True) + ",",
                                 json.dumps(runs[1], sort_keys=True), "]"]
    head = {"worker": "local/cpu1", "results_": 3}
    whole = json_text_with(head, "results", text)
    assert json.loads(whole) == {**head, "results": runs}
    assert json_text_with(head, "results", "[]") == json_text({**head, "results": []})
    # a stored comparison reads back as it was; its runs are the rundir's measurements.json
    result = RunResult.model_validate({
        "sha256": "0" * 64, "args": ["1"], "worker": "local/cpu1", "worker_class": "local",
        "cpu": 1, "records": [{"wall_ns": 5, "user_s": 0.1, "sys_s": 0.0, "maxrss_kb": 9,
                               "gc": {"minor_collections": 3}, "counts": {"Ir": 7}}]})
    c = Comparison(worker="local/cpu1", reference_times=[1.0], candidate_times=[0.9],
                   results=[result, result], stopped="target", metric="cycles")
    assert json.loads(c.text()) == c.to_json()
    assert Comparison.from_json(json.loads(c.text())) == c
    assert json.loads(c.results_text) == c.to_json()["results"]
    assert len(c.results_text.splitlines()) == 4
