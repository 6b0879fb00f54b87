"""The worker agent follows its master: one whose master died leaves its slot at once."""
from __future__ import annotations


def test_an_agent_waiting_for_its_slot_lock_leaves_when_its_master_dies(tmp_path, agent_pyz):
    """A master killed while its new agent waits for the CPU lock (the previous agent still
    finishing a run) must not leave that agent waiting: it would hold the slot's next agent,
    the master's resume, for the whole lock wait (bad inputs issue: more than 20 s)."""
    import fcntl
    import subprocess
    import sys
    import time
    lock = tmp_path / "cpu0.lock"
    held = open(lock, "w")
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        proc = subprocess.Popen([sys.executable, str(agent_pyz), "--cache-dir", str(tmp_path),
                                 "--lock", str(lock), "--lock-wait", "60"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        time.sleep(0.5)
        assert proc.poll() is None  # waiting for the lock
        assert proc.stdin is not None
        proc.stdin.close()  # the master is gone
        t0 = time.monotonic()
        assert proc.wait(timeout=30) == 0
        assert time.monotonic() - t0 < 10  # about 0.2 s; generous for a loaded machine
        assert proc.stderr is not None and proc.stderr.read() == b""
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()
    finally:
        held.close()
