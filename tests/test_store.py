"""The store under stress (issue 11): killed writers, full and read-only disks, bad paths,
compressed entries read beside old ones, and store-gc against real rundirs."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _can_mount() -> str | None:
    """Why a private mount namespace with a tmpfs cannot be made here, or None."""
    if shutil.which("unshare") is None:
        return "no unshare(1)"
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True)
    if probe.returncode != 0:
        return f"cannot mount a tmpfs in a mount namespace (root needed): {probe.stderr!r}"
    return None


def in_tmpfs(mount: Path, size: str, prepare: str, *cmd: str) -> subprocess.CompletedProcess:
    """Run ``cmd`` in a private mount namespace where ``mount`` is a fresh tmpfs of
    ``size`` on which the shell commands ``prepare`` ran first ($M: the mount point)."""
    mount.mkdir(exist_ok=True)
    script = f'M="$1"; shift; mount -t tmpfs -o size={size} tmpfs "$M" && {prepare} && "$@"'
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                           script, "sh", str(mount), *cmd], cwd=REPO, capture_output=True,
                          text=True, timeout=600)


def test_full_disk_during_linking_names_the_linkers_reason(compiler, tmp_path):
    """Issue 11: a full disk during linking said only 'linking kahan.exe failed'."""
    why = _can_mount()
    if why:
        pytest.skip(why)
    mount = tmp_path / "full"
    code = ("import sys; from pathlib import Path; from dispatcher.benchmark import *; "
            "from dispatcher.compiler import locate_compiler\n"
            "try:\n build_benchmark(resolve_benchmark('kahan'), Path(sys.argv[1]) / 'b', "
            "locate_compiler().ocamlopt)\nexcept BuildError as e:\n print(e)")
    proc = in_tmpfs(mount, "700k", "true", sys.executable, "-c", code, str(mount))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("kahan: linking kahan.exe failed"), proc.stdout
    assert "ld: final link failed: No space left on device" in proc.stdout, proc.stdout
