"""The agent's protocol: JSON lines, decoded and checked here, answered in request order.

Each line on stdin is one request object; each request gets exactly one response object on
one line of stdout, flushed at once.  Nothing else is ever written to stdout (the protocol
uses a private duplicate of fd 1; fd 1 itself is pointed at stderr so a stray print cannot
corrupt the stream).  A request may carry ``"id"``, which is echoed.  Requests may be sent
before earlier ones are answered; responses come in request order.  Bad requests, unknown
ops and failing binaries never kill the agent.  EOF on stdin ends the agent with status 0.

Ops:

``hello``
    agent_version (the sha256 of the zipapp the agent runs from; see ``version``), python,
    hostname, cpus (this process's affinity), perf (availability and per-event support,
    probed once), spawn (method: "forkserver", "gated" or "direct"; maxrss_exact),
    worker_class; with ``exact: true`` asked, exact (whether cachegrind runs here: available,
    version, identity, reason; ``cachegrind.probe``).
``has``  (``sha256``)
    present: the binary ``<cache-dir>/<sha256>`` exists and its content hash was verified.
``run``  (``sha256``, ``args``, ``runs``, ``cpu``, ``timeout``, ``expected_output``,
``env``, ``perf``, ``aslr``, ``profile_period_ns``, ``metric``)
    Runs the binary ``runs`` times in sequence, each pinned to ``cpu``, and returns
    ``{"ok": true, "sha256", "cpu", "spawn", "runs": [record, ...], "failed": n,
    "disturbed": n}`` (the record's fields: ``runner.new_record``).  Failed runs are records,
    never errors.  A run that was disturbed (it migrated between CPUs) is kept, marked, and
    run again, up to ``runs`` extra runs per request, so ``runs`` may hold more records than
    asked.  ``aslr`` (default false): address-space randomisation on and a random-size
    environment pad per run, instead of the default fixed layout.  ``profile_period_ns``
    (default 0: none): sample the binary's instruction pointer every that many ns of CPU
    time and add a ``profile`` to each record (``sampling.Sampler.read_and_close``).
    ``metric`` (default "time"): "cachegrind" runs the binary under cachegrind in a fixed
    environment (``cachegrind``) and adds its ``counts`` to each record; such a run is never
    judged disturbed (its counts do not depend on the CPU's other work); refused with
    exact_unavailable where valgrind is missing.
``shutdown``
    ``{"ok": true}``, then the agent exits 0.

A refused request gets ``{"id": ..., "ok": false, "code": CODE, "error": "<one line>"}``.
The ``error`` is for people; the master decides on ``code``, one of:

``bad_request``
    the line is not JSON, not an object, or a field is missing, mistyped or out of range
    (including a malformed sha256).  Sending it again will not help.
``unknown_op``
    ``op`` names no operation of this agent.
``not_in_cache``
    no usable binary under that sha256 in the cache (missing, or not a regular file):
    upload it and ask again.
``checksum_mismatch``
    the cached file's content does not hash to its name; the agent removed it: upload it
    and ask again.
``spawn_unavailable``
    the spawn method the agent was started with (``--spawn``) cannot work on this host.
``internal``
    a bug in the agent (the request may be fine); details on the agent's stderr.

Besides the JSON lines, the agent and whoever starts it share a few conventions, kept below
so each side names them once: the slot lock's exit status and stderr lines (``__main__``), the
default wait for a lock held by an exiting agent, and the per-machine lock directory that the
local backend and the Ray backend's actors share (``cpu<N>.lock`` in it).
``dispatcher/running/ray/actor.py`` travels to Ray nodes by value and so holds its own copies,
which a test checks against these.
"""
from __future__ import annotations

import collections
import json
import os
import re
import select
from typing import Any

BAD_REQUEST = "bad_request"
UNKNOWN_OP = "unknown_op"
NOT_IN_CACHE = "not_in_cache"
CHECKSUM_MISMATCH = "checksum_mismatch"
SPAWN_UNAVAILABLE = "spawn_unavailable"
EXACT_UNAVAILABLE = "exact_unavailable"  # a cachegrind run asked of a machine without valgrind
INTERNAL = "internal"
ERROR_CODES = frozenset((BAD_REQUEST, UNKNOWN_OP, NOT_IN_CACHE, CHECKSUM_MISMATCH,
                         SPAWN_UNAVAILABLE, EXACT_UNAVAILABLE, INTERNAL))
# What a run measures: "time" (the clock, rusage, perf counters) or "cachegrind" (the exact
# metric: the binary under Valgrind's cachegrind, its counts in the record's "counts").
METRICS = ("time", "cachegrind")

SHA256_RE = re.compile(r"\A[0-9a-f]{64}\Z")
MAX_RUNS = 10000
MAX_TIMEOUT_S = 7 * 24 * 3600.0
DEFAULT_TIMEOUT_S = 600.0
MIN_PROFILE_PERIOD_NS = 10_000  # 100 kHz: beyond that the sampling is the workload

# The slot lock (``--lock FILE``): an agent that cannot take it (held by another live agent
# past ``--lock-wait``, or not openable) writes one stderr line starting with one of
# SLOT_LOCK_LINES and exits with SLOT_LOCK_BUSY_STATUS before it answers anything.
SLOT_LOCK_BUSY_STATUS = 75  # EX_TEMPFAIL
STDERR_PREFIX = "agent: "  # every line the agent itself writes on stderr
SLOT_LOCK_LINES = (STDERR_PREFIX + "slot lock ", STDERR_PREFIX + "cannot open the slot lock ")
DEFAULT_LOCK_WAIT_S = 30.0  # how long a new agent waits for the lock of an agent that is exiting
# One lock per CPU of a machine, shared by every master and user there (local backend, Ray).
LOCK_DIR_ENV = "INLINING_ORCHESTRATOR_LOCK_DIR"
DEFAULT_LOCK_DIR = "/tmp/inlining-orchestrator-locks"
CPU_LOCK_NAME = "cpu%d.lock"  # % the CPU number


def slot_lock_message(line: str) -> str | None:
    """The reason in an agent's stderr ``line`` (without ``agent: ``) if it says why the slot
    lock could not be taken, else None."""
    return line[len(STDERR_PREFIX):] if line.startswith(SLOT_LOCK_LINES) else None


class RequestError(Exception):
    """A request the agent refuses: ``code`` for the master, the message for people."""

    def __init__(self, message: str, code: str = BAD_REQUEST):
        super().__init__(message)
        self.code = code


def one_line(text: object) -> str:
    return " ".join(str(text).split()) or "error"


def error_response(code: str, message: object) -> dict:
    """The body of a refusal (the id is added by whoever answers)."""
    return {"ok": False, "code": code, "error": one_line(message)}


def internal_error(e: BaseException) -> dict:
    return error_response(INTERNAL, "internal error: %s: %s" % (type(e).__name__, e))


def decode_request(line: bytes) -> tuple[str, Any]:
    """-> ("req", decoded value) or ("bad", the complete response to send)."""
    try:
        return ("req", json.loads(line.decode("utf-8")))
    except ValueError as e:  # includes UnicodeDecodeError
        return ("bad", dict({"id": None}, **error_response(BAD_REQUEST,
                                                           "malformed request: %s" % e)))


def encode_response(response: dict) -> bytes:
    try:
        data = json.dumps(response, allow_nan=False)
    except (TypeError, ValueError) as e:
        req_id = response.get("id")
        data = json.dumps(dict(
            {"id": req_id if isinstance(req_id, (str, int, float, type(None))) else None},
            **error_response(INTERNAL, "unencodable response: %s" % e)))
    return data.encode("utf-8") + b"\n"


class Requests:
    """Request lines read from a file descriptor as they come, decoded, in order.

    ``items`` holds ("req", value) for a decoded line and ("bad", response) for a malformed
    one; ``eof`` is set once the stream has ended."""

    def __init__(self, fd: int):
        self.fd = fd
        self.items: collections.deque[tuple[str, Any]] = collections.deque()
        self.eof = False
        self._buf = b""

    def fill(self, timeout: float | None) -> None:
        """Read what is available (waiting up to ``timeout`` s, None: until something is)."""
        if self.eof or (timeout is not None and not select.select([self.fd], [], [], timeout)[0]):
            return
        data = os.read(self.fd, 1 << 16)
        if not data:
            self.eof = True
            data = b"\n"  # a last line without its newline still counts
        lines = (self._buf + data).split(b"\n")
        self._buf = lines.pop()
        for line in lines:
            if line.strip():
                self.items.append(decode_request(line))


def check_sha(sha: object) -> str:
    if not isinstance(sha, str) or not SHA256_RE.match(sha):
        raise RequestError("invalid sha256 %s: need 64 lowercase hex digits"
                           % json.dumps(sha)[:80])
    return sha


class RunRequest:
    """The fields of a ``run`` request, checked (``parse_run``)."""
    __slots__ = ("sha", "args", "runs", "cpu", "timeout", "expected", "env", "perf", "aslr",
                 "profile_period_ns", "metric")

    def __init__(self, sha: str, args: list[str], runs: int, cpu: int, timeout: float,
                 expected: dict | None, env: dict[str, str], perf: bool, aslr: bool = False,
                 profile_period_ns: int = 0, metric: str = "time"):
        self.sha, self.args, self.runs, self.cpu = sha, args, runs, cpu
        self.timeout, self.expected, self.env, self.perf = timeout, expected, env, perf
        self.aslr = aslr
        self.profile_period_ns = profile_period_ns
        self.metric = metric


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_run(request: dict, cpus: frozenset[int]) -> RunRequest:
    """Check a run request's fields (``cpus``: those the agent may pin to) -> RunRequest;
    RequestError (bad_request) naming the first bad field.  ``expected_output.text`` comes
    back as UTF-8 bytes."""
    sha = check_sha(request.get("sha256"))
    args = request.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise RequestError("args must be a list of strings")
    if any("\0" in a for a in args):
        raise RequestError("args must not contain NUL characters")
    runs = request.get("runs", 1)
    if not _is_int(runs) or not 1 <= runs <= MAX_RUNS:
        raise RequestError("runs must be an integer in 1..%d" % MAX_RUNS)
    cpu = request.get("cpu")
    if not _is_int(cpu) or cpu not in cpus:
        raise RequestError("cpu must be one of this agent's CPUs %s, got %s"
                           % (sorted(cpus), json.dumps(cpu)))
    timeout = request.get("timeout", DEFAULT_TIMEOUT_S)
    if (not isinstance(timeout, (int, float)) or isinstance(timeout, bool)
            or not 0 < timeout <= MAX_TIMEOUT_S):
        raise RequestError("timeout must be a number of seconds in (0, %g]" % MAX_TIMEOUT_S)
    expected = request.get("expected_output")
    bad_expected = 'expected_output must be null, {"sha256": hex} or {"text": str}'
    if expected is not None:
        if not isinstance(expected, dict) or len(expected) != 1:
            raise RequestError(bad_expected)
        if "sha256" in expected:
            if not isinstance(expected["sha256"], str) or not SHA256_RE.match(
                    expected["sha256"]):
                raise RequestError("expected_output.sha256 must be 64 lowercase hex digits")
        elif "text" in expected:
            if not isinstance(expected["text"], str):
                raise RequestError("expected_output.text must be a string")
            expected = {"text": expected["text"].encode("utf-8")}
        else:
            raise RequestError(bad_expected)
    env = request.get("env") or {}
    if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and k and "=" not in k
            and "\0" not in k + v for k, v in env.items()):
        raise RequestError("env must be an object of string names (no '=') to strings")
    try:
        for text in args + list(env) + list(env.values()):
            os.fsencode(text)
    except UnicodeEncodeError:
        raise RequestError("args and env must be encodable file-system strings") from None
    perf = request.get("perf", True)
    if not isinstance(perf, bool):
        raise RequestError("perf must be true or false")
    aslr = request.get("aslr", False)
    if not isinstance(aslr, bool):
        raise RequestError("aslr must be true or false")
    period = request.get("profile_period_ns", 0)
    if not _is_int(period) or not (period == 0 or MIN_PROFILE_PERIOD_NS <= period <= 10**10):
        raise RequestError("profile_period_ns must be 0 or an integer in %d..%d"
                           % (MIN_PROFILE_PERIOD_NS, 10**10))
    metric = request.get("metric", "time")
    if metric not in METRICS:
        raise RequestError("metric must be one of %s, got %s"
                           % (", ".join(METRICS), json.dumps(metric)[:80]))
    if metric != "time" and period:
        raise RequestError("profile_period_ns needs the time metric (cachegrind counts all)")
    return RunRequest(sha, args, runs, cpu, float(timeout), expected, env, perf, aslr, period,
                      metric)
