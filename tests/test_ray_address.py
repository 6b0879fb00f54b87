"""Ray's ``address: auto`` joins only a cluster this machine runs for this user (issue 36 item
4): a stale session file, one another user or another network left, is one line and exit 2
within seconds, never minutes of Ray retrying.  In this process, no cluster started."""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
import yaml

from dispatcher.running.backend import BackendUnavailable
from dispatcher.running.ray import local_session
from tests.helpers import invoke, one_line_error


@pytest.fixture
def ray_tmp(tmp_path, monkeypatch):
    """Ray's temp directory in the test's own, no $RAY_ADDRESS, no raylet of this user seen
    (a Ray test beside this one may run one), and Ray's environment put back afterwards."""
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_USAGE_STATS_ENABLED"):
        monkeypatch.setenv(name, os.environ.get(name, ""))
    monkeypatch.setattr(local_session, "own_raylets", lambda: set())
    (tmp_path / "ray").mkdir()
    return tmp_path / "ray" / local_session.SESSION_FILE


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_config(tmp: Path) -> Path:
    path = tmp / "ray.yaml"
    path.write_text(yaml.safe_dump({"backend": "ray", "store": str(tmp / "store"),
                                    "ray": {"address": "auto", "auth": "none"},
                                    "search": {"rundirs": str(tmp / "rundirs"),
                                               "batch_log": str(tmp / "batch.log")}}))
    return path


@pytest.mark.parametrize("content, expected", [
    ("127.0.0.1:{port}", "which does not answer"),
    ("198.51.100.7:6379", "neither an address of this machine nor the head of a raylet"),
    ("nonsense", "not a Ray address"),
])
def test_a_stale_or_foreign_session_file_is_one_line_within_seconds(
        tmp_path, ray_tmp, content, expected):
    pytest.importorskip("ray")
    ray_tmp.write_text(content.format(port=_free_port()))
    t0 = time.monotonic()
    line = one_line_error(invoke("run_training_experiments", "--config",
                                 str(_ray_config(tmp_path)), "--tasks",
                                 str(_tasks(tmp_path)), cwd=tmp_path))
    assert time.monotonic() - t0 < 30
    assert line.startswith(f"run_training_experiments: ray: address auto: {ray_tmp}"), line
    assert expected in line, line


def _tasks(tmp: Path) -> Path:
    path = tmp / "tasks"
    path.write_text("kahan\n")
    return path


def test_a_session_file_of_another_user_is_not_followed(ray_tmp):
    if os.getuid() != 0:
        pytest.skip("needs root to give the file to another user")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        ray_tmp.write_text(f"127.0.0.1:{server.getsockname()[1]}")
        os.chown(ray_tmp, 4242, 4242)
        with pytest.raises(BackendUnavailable, match="left by another user"):
            local_session.auto_address()


def test_no_cluster_of_this_user_is_one_line(ray_tmp):
    with pytest.raises(BackendUnavailable) as err:
        local_session.auto_address()
    assert "no Ray cluster of this user runs on this machine" in str(err.value)
    assert "\n" not in str(err.value)


def test_this_users_answering_cluster_is_the_address(ray_tmp, monkeypatch):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = f"127.0.0.1:{server.getsockname()[1]}"
        ray_tmp.write_text(address + "\n")
        assert local_session.auto_address() == address
        # a node that joined a head elsewhere: the session file names the head, which one
        # of this user's raylets here was started with
        local = local_session.is_local
        monkeypatch.setattr(local_session, "is_local", lambda host: False)
        with pytest.raises(BackendUnavailable, match="neither an address of this machine"):
            local_session.auto_address()
        monkeypatch.setattr(local_session, "own_raylets", lambda: {address})
        assert local_session.auto_address() == address
        monkeypatch.setattr(local_session, "is_local", local)
        # without the session file: this user's own raylet's GCS address
        ray_tmp.unlink()
        monkeypatch.setattr(local_session, "own_raylets", lambda: {address, f"127.0.0.1:{_free_port()}"})
        assert local_session.auto_address() == address
        # $RAY_ADDRESS is the user's own choice
        monkeypatch.setenv("RAY_ADDRESS", address)
        monkeypatch.setattr(local_session, "own_raylets", lambda: set())
        assert local_session.auto_address() == address
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{_free_port()}")
    with pytest.raises(BackendUnavailable, match=r"\$RAY_ADDRESS names .* does not answer"):
        local_session.auto_address()


def test_own_raylets_reads_only_this_users_raylets():
    """Nothing of another user, and only raylet processes (this test process is neither)."""
    assert all(":" in a for a in local_session.own_raylets())
