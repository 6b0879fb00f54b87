"""What runs on a Ray node that compiles: one whole build of a candidate, as a Ray task.

Its code travels to the nodes by value, as ``dispatcher.running.ray.actor``'s does, so it uses the
standard library only.  The master sends the sources, the overrides files and the commands of
a build (``dispatcher.build.driver.build_commands``: relative paths, the compiler by its absolute
path, which must be the same patched compiler at the same place on every compiling node) and
gets back the binary, the decision dumps and everything the compiler said, or the failed
command's exit status and output, from which it makes the same error a build on the master
makes.  The build runs in a fresh temporary directory, removed afterwards.
"""
from __future__ import annotations

import os
import subprocess
import tempfile
import time
from typing import Any

DUMP_SUFFIX = ".decisions.sexp"


def build(files: dict[str, bytes], commands: list[tuple[list[str], str]], binary_name: str,
          timeout: float) -> dict[str, Any]:
    """Run ``commands`` in a directory holding ``files`` (relative names) -> ``{"ok": True,
    "binary", "dumps", "output"}``, ``{"ok": False, "what", "exit", "text", "output"}`` (a
    command failed or, with ``exit`` None, ran out of ``timeout``), or ``{"lost": why}``
    when this node cannot build at all."""
    compiler = commands[0][0][0] if commands else ""
    if not os.access(compiler, os.X_OK):
        return {"lost": f"no compiler at {compiler} on node {os.uname().nodename}"}
    deadline = time.monotonic() + timeout
    env = dict(os.environ)
    env.pop("OCAMLPARAM", None)  # would silently add flags to every compile
    log: list[str] = []
    with tempfile.TemporaryDirectory(prefix="inlining-build-") as outdir:
        for name, data in files.items():
            path = os.path.join(outdir, name)
            if os.path.isabs(name) or os.path.normpath(name).startswith(".."):
                return {"lost": f"refused file name {name!r}"}
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
        for cmd, what in commands:
            log.append("$ " + " ".join(cmd))
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise subprocess.TimeoutExpired(cmd, timeout)
                proc = subprocess.run(cmd, cwd=outdir, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, timeout=left,
                                      start_new_session=True)
            except subprocess.TimeoutExpired:
                return {"ok": False, "what": what, "exit": None, "text": "",
                        "output": "\n".join(log)}
            except OSError as exc:
                return {"lost": f"cannot run {cmd[0]} on node {os.uname().nodename}: {exc}"}
            text = proc.stdout.decode("utf-8", errors="replace")
            if text:
                log.append(text.rstrip("\n"))
            if proc.returncode != 0:
                return {"ok": False, "what": what, "exit": proc.returncode, "text": text,
                        "output": "\n".join(log)}
        try:
            with open(os.path.join(outdir, binary_name), "rb") as f:
                binary = f.read()
        except OSError:
            return {"ok": False, "what": f"linking {binary_name}", "exit": 0,
                    "text": "no binary produced", "output": "\n".join(log)}
        dumps = {}
        for name in sorted(os.listdir(outdir)):
            if name.endswith(DUMP_SUFFIX):
                with open(os.path.join(outdir, name), "rb") as f:
                    dumps[name] = f.read()
    return {"ok": True, "binary": binary, "dumps": dumps,
            "output": "\n".join(log) + ("\n" if log else ""),
            "node": os.uname().nodename}
