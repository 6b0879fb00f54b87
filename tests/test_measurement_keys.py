"""Measurement keys: a stored verdict is reused only for the job it was measured for."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from dispatcher.core.jobs import RunJob
from dispatcher.core.records import RunRecord, RunResult
from dispatcher.storage.store import Store, binary_key, measurement_key

SHA = "ab" * 32
# measurement_key(job(), "local") as computed before profile_period_ns existed
PINNED_KEY = "0d2fe158c1481483d5a04eda5d389e648bcce021ebfcff44509d448b15477797"


def job(**changes) -> RunJob:
    base = RunJob(sha256=SHA, binary=Path("/a/binary"), args=("100",), runs=3, timeout=30.0,
                  expected_output={"text": "42\n"}, perf=True, env={"OCAMLRUNPARAM": "s=1M"})
    return dataclasses.replace(base, **changes)


def result(worker_class: str = "local", runs: int = 3) -> RunResult:
    record = RunRecord(wall_ns=10**6, user_s=0.0, sys_s=0.0, maxrss_kb=1, exit_status=0,
                       output_ok=True)
    return RunResult(sha256=SHA, args=("100",), worker="local/cpu1", worker_class=worker_class,
                     cpu=1, records=(record,) * runs)


def test_identical_jobs_share_a_key_whatever_their_path_run_count_or_number_type():
    key = measurement_key(job(), "local")
    assert measurement_key(job(), "local") == key
    assert measurement_key(job(binary=Path("/elsewhere/x.exe"), runs=10, timeout=30), "local") \
        == key
    assert measurement_key(job(env={"OCAMLRUNPARAM": "s=1M"}), "local") == key


@pytest.mark.parametrize("change", [
    {"sha256": "cd" * 32}, {"args": ("200",)}, {"args": ("100", "x")},
    {"expected_output": {"text": "43\n"}}, {"expected_output": None},
    {"env": {}}, {"env": {"OCAMLRUNPARAM": "s=2M"}}, {"perf": False}, {"timeout": 10.0},
])
def test_everything_measured_is_in_the_key(change):
    assert measurement_key(job(**change), "local") != measurement_key(job(), "local")


def test_the_worker_class_is_in_the_key():
    assert measurement_key(job(), "fast") != measurement_key(job(), "slow")


def test_every_request_field_but_the_cpu_and_run_count_is_identity():
    """A run option added to the job (and its request) joins the key without further code;
    one sent in the request but not kept on the job would be missed, and fails here."""
    identity = job().measurement_identity()
    request = job().request(cpu=5)
    assert set(request) - {"op", "cpu", "runs"} <= set(identity)
    assert set(identity) == {f.name for f in dataclasses.fields(RunJob)} - {"binary", "runs"} \
        - set(RunJob.LATER_OPTIONS)
    # an option added later joins the key once it is set, and is sent then
    profiled = job(profile_period_ns=100_000)
    assert set(profiled.request(cpu=5)) - {"op", "cpu", "runs"} \
        <= set(profiled.measurement_identity())
    assert set(profiled.measurement_identity()) == set(identity) | {"profile_period_ns"}


def test_options_added_later_keep_the_keys_of_measurements_already_stored():
    """profile_period_ns came after measurements were stored: at its default the key is the
    one computed before it existed (pinned here)."""
    assert measurement_key(job(), "local") == PINNED_KEY
    assert measurement_key(job(profile_period_ns=100_000), "local") != PINNED_KEY


def test_store_answers_only_the_job_measured(tmp_path):
    store = Store(tmp_path / "store")
    store.add_measurement(result(), job())
    assert len(store.job_measurements(job(), "local")) == 1
    assert len(store.job_measurements(job(runs=1), "local")) == 1  # any run count
    assert store.job_measurements(job(expected_output={"text": "43\n"}), "local") == []
    assert store.job_measurements(job(), "other") == []
    store.add_measurement(result(), job(perf=False))
    # Every measurement of the binary, whatever its settings.
    assert len(store.measurements_for(SHA, ("100",), "local")) == 2
    entry = next(store.measurements.glob("*/*.json"))
    assert json.loads(entry.read_text())["job"]["expected_output"] == {"text": "42\n"}


def test_old_entries_are_never_read(tmp_path):
    """An entry keyed by (binary, arguments, class) alone, as before, does not answer."""
    store = Store(tmp_path / "store")
    old = binary_key(SHA, ("100",), "local")
    path = store.measurements / old[:2] / f"{old}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"sha256": SHA, "args": ["100"], "worker_class": "local",
                                "results": [result().to_json()]}))
    assert store.job_measurements(job(), "local") == []
    assert store.measurements_for(SHA, ("100",), "local") == []


def test_an_unreadable_entry_is_measured_again(tmp_path):
    store = Store(tmp_path / "store")
    store.add_measurement(result(), job())
    next(store.measurements.glob("*/*.json")).write_text('{"results": [{"bad": 1}]}')
    assert store.job_measurements(job(), "local") == []
    store.add_measurement(result(), job())
    assert len(store.job_measurements(job(), "local")) == 1
