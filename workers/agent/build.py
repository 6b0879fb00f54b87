"""One whole build of a candidate on a machine that compiles for the master: a Ray node (as a
Ray task) or an SSH host (``python3 agent.pyz build``: one JSON request on stdin, one JSON
reply on stdout).

Its code travels to Ray nodes by value, as ``dispatcher.running.ray.actor``'s does, and to SSH
hosts inside the agent's zipapp, so it uses the standard library only.  The master sends the
sources, the overrides files and the commands of a build
(``dispatcher.build.driver.build_commands``: relative paths, the compiler by its absolute path
on the building machine) and the sha256 of its own compiler: a machine whose compiler is
another one builds nothing (a binary of another compiler stored under the master's compiler
would be wrong for good).  It gets back the binary, the decision dumps and everything the
compiler said, or the failed command's exit status and output, from which it makes the same
error a build on the master makes.  The build runs in a fresh temporary directory, removed
afterwards.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any

DUMP_SUFFIX = ".decisions.sexp"


_IDENTITIES: dict[tuple, str] = {}  # (path, inode, size, mtime) -> sha256, per process


#: Where ``main`` keeps the compiler's sha256 between builds (``--identity-cache``): an SSH
#: host starts a process per build, and hashing the compiler took as long as the process's
#: start.  Keyed as the per-process cache is, so a compiler replaced is hashed again.
_IDENTITY_FILE: list[str] = []


def compiler_sha256(path: str) -> str:
    """sha256 of the compiler binary, hashed once per process (a Ray worker process builds
    many times), or once per host with an identity file, while the file stays the same."""
    st = os.stat(path)
    key = (path, st.st_ino, st.st_size, st.st_mtime_ns)
    known = _IDENTITIES.get(key)
    if known is None:
        known = _remembered(key)
        if known is None:
            known = _hash(path)
            _remember(key, known)
        _IDENTITIES[key] = known
    return known


def _hash(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _remembered(key: tuple) -> str | None:
    if not _IDENTITY_FILE:
        return None
    try:
        with open(_IDENTITY_FILE[0]) as f:
            known = json.load(f)
    except (OSError, ValueError):
        return None
    value = known.get("|".join(map(str, key))) if isinstance(known, dict) else None
    return value if isinstance(value, str) and len(value) == 64 else None


def _remember(key: tuple, sha: str) -> None:
    if not _IDENTITY_FILE:
        return
    path = _IDENTITY_FILE[0]
    try:  # one entry: the compiler at this path now; a lost race writes the same
        tmp = "%s.%d" % (path, os.getpid())
        with open(tmp, "w") as f:
            json.dump({"|".join(map(str, key)): sha}, f)
        os.replace(tmp, path)
    except OSError:
        pass  # a cache: the next build hashes again


def _children_cpu() -> float:
    """CPU seconds, user and system, of this process's children waited for so far: a
    command's is the difference around it (this process runs one build at a time, and an
    SSH host's or a Ray task's process nothing else)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def snapshot(directory: str) -> dict[str, tuple[int, int, int]]:
    """The plain files of ``directory`` by name -> (inode, size, mtime): two snapshots around a
    command say which files it wrote (the master's builds compare them too)."""
    out = {}
    for entry in os.scandir(directory):
        if entry.is_file(follow_symlinks=False):
            st = entry.stat(follow_symlinks=False)
            out[entry.name] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out


def build(files: dict[str, bytes], commands: list[tuple[list[str], str]], binary_name: str,
          timeout: float, compiler_identity: str | None = None) -> dict[str, Any]:
    """Run ``commands`` in a directory holding ``files`` (relative names) -> ``{"ok": True,
    "binary", "dumps", "units", "link_cpu_s", "output"}``, ``{"ok": False, "what", "exit",
    "text", "output"}`` (a command failed or, with ``exit`` None, ran out of ``timeout``), or
    ``{"lost": why}`` when this machine cannot build at all (no compiler, or with
    ``compiler_identity`` a compiler whose sha256 is another).  ``units``: for each command
    but the last (the link), the files it wrote (name -> bytes), what it said and its CPU
    seconds (``cpu_s``), which the master keeps in its unit cache."""
    compiler = commands[0][0][0] if commands else ""
    node = os.uname().nodename
    if not os.access(compiler, os.X_OK):
        return {"lost": f"no compiler at {compiler} on node {node}"}
    if compiler_identity is not None:
        try:
            found = compiler_sha256(compiler)
        except OSError as exc:
            return {"lost": f"cannot read the compiler {compiler} on node {node}: {exc}"}
        if found != compiler_identity:
            return {"lost": f"the compiler {compiler} on node {node} is not the master's "
                            f"(sha256 {found[:16]}, the master's {compiler_identity[:16]})"}
    deadline = time.monotonic() + timeout
    env = dict(os.environ)
    env.pop("OCAMLPARAM", None)  # would silently add flags to every compile
    log: list[str] = []
    units: list[dict[str, Any]] = []
    link_cpu: float | None = None
    with tempfile.TemporaryDirectory(prefix="inlining-build-") as outdir:
        for name, data in files.items():
            path = os.path.join(outdir, name)
            if os.path.isabs(name) or os.path.normpath(name).startswith(".."):
                return {"lost": f"refused file name {name!r}"}
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
        for index, (cmd, what) in enumerate(commands):
            before = snapshot(outdir)
            log.append("$ " + " ".join(cmd))
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise subprocess.TimeoutExpired(cmd, timeout)
                cpu0 = _children_cpu()
                proc = subprocess.run(cmd, cwd=outdir, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, timeout=left,
                                      start_new_session=True)
                cpu = _children_cpu() - cpu0
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
            if index < len(commands) - 1:
                after = snapshot(outdir)
                written = {}
                for name in sorted(n for n, st in after.items() if before.get(n) != st):
                    with open(os.path.join(outdir, name), "rb") as f:
                        written[name] = f.read()
                units.append({"files": written, "output": text.rstrip("\n"), "cpu_s": cpu})
            else:
                link_cpu = cpu
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
    return {"ok": True, "binary": binary, "dumps": dumps, "units": units,
            "link_cpu_s": link_cpu,
            "output": "\n".join(log) + ("\n" if log else ""),
            "node": node}


# --------------------------------------------------------------------------- over a pipe

def _bytes(value: Any, what: str) -> bytes:
    try:
        if not isinstance(value, str):
            raise ValueError("not text")
        return base64.b64decode(value.encode("ascii"), validate=True)
    except ValueError:  # binascii.Error and UnicodeEncodeError are ValueErrors
        raise ValueError(f"{what}: expected base64 text") from None


def request_json(files: dict[str, bytes], commands: list[tuple[list[str], str]],
                 binary_name: str, timeout: float, compiler_identity: str | None = None) -> bytes:
    """``build``'s arguments as the request ``request_of`` reads."""
    return json.dumps({"files": {k: base64.b64encode(v).decode("ascii") for k, v in files.items()},
                       "commands": [[list(argv), what] for argv, what in commands],
                       "binary_name": binary_name, "timeout": timeout,
                       "compiler_identity": compiler_identity}).encode()


def request_of(data: bytes) -> dict[str, Any]:
    """The arguments of ``build`` from a request's JSON (files in base64); ValueError names
    what is wrong."""
    try:
        message = json.loads(data)
    except ValueError as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(message, dict):
        raise ValueError("not a JSON object")
    files = message.get("files")
    commands = message.get("commands")
    if not isinstance(files, dict):
        raise ValueError("files: expected an object of names to base64")
    if (not isinstance(commands, list) or not commands
            or not all(isinstance(c, list) and len(c) == 2 and isinstance(c[1], str)
                       and isinstance(c[0], list) and c[0]
                       and all(isinstance(w, str) for w in c[0]) for c in commands)):
        raise ValueError("commands: expected a list of [argv, what]")
    name, timeout = message.get("binary_name"), message.get("timeout")
    if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
        raise ValueError("binary_name: expected a file name")
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
        raise ValueError("timeout: expected a positive number of seconds")
    identity = message.get("compiler_identity")
    if identity is not None and not isinstance(identity, str):
        raise ValueError("compiler_identity: expected a sha256")
    return {"files": {str(k): _bytes(v, f"files[{k!r}]") for k, v in files.items()},
            "commands": [(list(c[0]), c[1]) for c in commands], "binary_name": name,
            "timeout": float(timeout), "compiler_identity": identity}


def _b64(files: dict[str, bytes]) -> dict[str, str]:
    return {k: base64.b64encode(v).decode("ascii") for k, v in files.items()}


def _seconds(value: Any) -> float | None:
    """A number of CPU seconds from a reply (None: not one)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
    return float(value) if ok else None


def reply_json(reply: dict[str, Any]) -> bytes:
    """``build``'s reply as JSON, its bytes in base64."""
    out = dict(reply)
    if "binary" in out:
        out["binary"] = base64.b64encode(out["binary"]).decode("ascii")
    if "dumps" in out:
        out["dumps"] = _b64(out["dumps"])
    if "units" in out:
        out["units"] = [{"files": _b64(u["files"]), "output": u["output"],
                         "cpu_s": u.get("cpu_s")} for u in out["units"]]
    return json.dumps(out).encode()


def reply_of(data: bytes) -> dict[str, Any]:
    """The reply ``reply_json`` wrote, its bytes decoded; ValueError if it is not one."""
    reply = json.loads(data)
    if not isinstance(reply, dict) or not ("lost" in reply or "ok" in reply):
        raise ValueError("not a build reply")
    if reply.get("ok"):
        reply["binary"] = _bytes(reply.get("binary"), "binary")
        dumps = reply.get("dumps")
        if not isinstance(dumps, dict):
            raise ValueError("dumps: expected an object")
        reply["dumps"] = {str(k): _bytes(v, f"dumps[{k!r}]") for k, v in dumps.items()}
        units = reply.get("units", [])
        if (not isinstance(units, list)
                or not all(isinstance(u, dict) and isinstance(u.get("files"), dict)
                           and isinstance(u.get("output"), str) for u in units)):
            raise ValueError("units: expected a list of {files, output}")
        reply["units"] = [{"files": {str(k): _bytes(v, f"units[{i}].files[{k!r}]")
                                     for k, v in u["files"].items()},
                           "output": u["output"], "cpu_s": _seconds(u.get("cpu_s"))}
                          for i, u in enumerate(units)]
        reply["link_cpu_s"] = _seconds(reply.get("link_cpu_s"))
    return reply


def main(argv: list[str], stdin: Any = None, stdout: Any = None) -> int:
    """``python3 agent.pyz build [--cpus 0,1] [--identity-cache FILE]``: one request read to
    EOF, one reply written; the build's compilers pinned to ``--cpus`` (the CPUs its host
    gives compiles, none of them a measuring slot's); the compiler's sha256 kept in ``FILE``
    from one build to the next.  A request that is not one is refused as ``{"lost": why}``
    (status 0: the reply says it)."""
    stdin = stdin if stdin is not None else sys.stdin.buffer
    stdout = stdout if stdout is not None else sys.stdout.buffer
    try:
        options = dict(zip(argv[::2], argv[1::2]))
        if len(argv) % 2 or set(options) - {"--cpus", "--identity-cache"}:
            raise ValueError(f"unknown arguments {argv!r}")
        if "--cpus" in options:
            cpus = {int(c) for c in options["--cpus"].split(",")}
            os.sched_setaffinity(0, cpus)  # the compilers inherit it
        if "--identity-cache" in options:
            _IDENTITY_FILE[:] = [options["--identity-cache"]]
        reply = build(**request_of(stdin.read()))
    except (ValueError, OSError) as exc:
        reply = {"lost": f"refused build request: {exc}"}
    stdout.write(reply_json(reply))
    stdout.flush()
    return 0
