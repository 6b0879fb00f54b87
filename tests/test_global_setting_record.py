"""``global-setting.json`` is checked whole on every read: it chooses compiler flags, so a
tampered or broken record is refused in one line naming the file and the field, and nothing
in it reaches the compiler unchecked (issue: bad inputs on the new surfaces)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dispatcher.baselines import GRID, RECORD, BaselineError, read_record


def _record(**changes) -> dict:
    chosen = "O3-max-depth-3"
    data = {"version": 1, "chosen": chosen, "flags": list(GRID[chosen]),
            "benchmarks": ["hamming", "kahan"], "size": "quick",
            "grid": {k: list(v) for k, v in GRID.items()},
            "training": {chosen: {"geomean": [1.02, 1.01, 1.03],
                                  "benchmarks": {"kahan": [1.02, 1.01, 1.03, 1.0],
                                                 "hamming": [None, None, None, None]}}}}
    data.update(changes)
    return data


def _write(tmp_path: Path, data) -> Path:
    path = tmp_path / RECORD
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_a_sound_record_is_read(tmp_path):
    assert read_record(_write(tmp_path, _record()))["chosen"] == "O3-max-depth-3"
    assert read_record(_write(tmp_path, _record(chosen=None, flags=[]))) is not None


@pytest.mark.parametrize("changes, field", [
    # the shell command a -pp preprocessor would run: never reaches the compiler
    ({"flags": ["-O3", "-pp", "touch FILE; cat"]}, "'-pp' is not allow-listed"),
    ({"flags": ["-O3", "-I", "/etc"]}, "'-I' is not allow-listed"),
    ({"grid": {"O2": ["-O2", "-pp", "sh"]}, "chosen": "O2", "flags": ["-O2", "-pp", "sh"]},
     "grid.O2: '-pp' is not allow-listed"),
    ({"flags": ["-O2"]}, "chosen: 'O3-max-depth-3' is not a setting of its grid with flags"),
    ({"chosen": "O9"}, "chosen: 'O9' is not a setting of its grid"),
    ({"chosen": None}, "flags given but no setting chosen"),
    ({"flags": "-O3"}, "flags: Input should be a valid list"),
    ({"flags": ["-O3"] * 200_001}, "flags: List should have at most 64 items"),
    ({"flags": [3]}, "flags.0: Input should be a valid string"),
    ({"benchmarks": "kahan"}, "benchmarks: Input should be a valid list"),
    ({"training": {"x": {"geomean": "fast", "benchmarks": {}}}}, "training.x.geomean"),
    ({"training": {"x": {"geomean": None, "benchmarks": {"kahan": [1, 2]}}}},
     "training.x.benchmarks.kahan"),
    ({"extra": 1}, "extra: Extra inputs are not permitted"),
    ({"version": 2}, "not a global-setting record of version 1"),
])
def test_a_tampered_record_is_refused_naming_the_field(tmp_path, changes, field):
    path = _write(tmp_path, _record(**changes))
    with pytest.raises(BaselineError) as err:
        read_record(path)
    line = str(err.value)
    assert line.startswith(f"{path}: ") and field in line and "\n" not in line, line
    assert line.endswith("--retune writes it again")


def test_a_file_that_is_not_a_regular_file_is_refused_without_reading_it(tmp_path):
    fifo = tmp_path / "fifo" / RECORD
    fifo.parent.mkdir()
    os.mkfifo(fifo)  # reading it would block for ever
    for path in (fifo, tmp_path, Path("/dev/zero")):  # /dev/zero: an endless read
        with pytest.raises(BaselineError, match="not a regular file"):
            read_record(path)
    deep = _write(tmp_path, "[" * 100_000 + "]" * 100_000)
    with pytest.raises(BaselineError, match="unreadable"):
        read_record(deep)
