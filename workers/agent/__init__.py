"""The worker agent: runs cached benchmark binaries pinned to one CPU and reports timings.

One agent per CPU slot of a worker machine, started by the master as a local subprocess or
over SSH, speaking JSON lines on stdin/stdout (``protocol``).  Standard library only, Python
3.9+, no imports from the project: the master ships this package as one zipapp
(``workers/zipapp.py``) whose sha256 is the agent's version (``version``).

Modules, one concern each:

``__main__``  arguments, the slot lock, the serve loop's plumbing
``protocol``  request decoding, response encoding, error codes (the protocol's reference)
``service``   the Agent: ops, request checks, the pipelined serve loop
``runner``    the run pipeline (prepare, launch, wait, finish) and the run record
``spawn``     how a binary is started: fork server, gated sh, direct
``perf``      perf_event_open counters
``watchdog``  the deadline thread
``cache``     the binary cache, checked by sha256
``proc``      process-group, affinity and limit helpers
``version``   the deterministic zip of this package and its sha256
"""
