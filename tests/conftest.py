import atexit
import os
import shutil
import tempfile

import pytest

from dispatcher.build.toolchain import Compiler, locate_compiler

# The suite's local agents lock CPUs in a directory of their own: a test session never waits
# for (or is refused by) a real master on this machine, nor another test session.  Under
# pytest-xdist each worker is a session of its own (the workers inherit the controller's
# environment, hence the fresh directory per worker): two workers' tests share the CPUs as any
# loaded machine's neighbours do, and none waits on another's lock.
if os.environ.get("PYTEST_XDIST_WORKER") or "INLINING_ORCHESTRATOR_LOCK_DIR" not in os.environ:
    os.environ["INLINING_ORCHESTRATOR_LOCK_DIR"] = _locks = tempfile.mkdtemp(
        prefix="inlining-test-locks-")
    atexit.register(shutil.rmtree, _locks, ignore_errors=True)  # not one left per session
# The suite runs on shared, loaded CPUs (2-CPU VMs running other work), where a quick run's
# CPU share is often below the default floor of 0.8: without a floor, every comparison
# would be unresolved.  Tests of the floor set measure.min_cpu_share in their configs.
os.environ.setdefault("INLINING_ORCHESTRATOR_MIN_CPU_SHARE", "0")
# Nor can a share 5 points below a binary's own earlier ones tell contention from the others'
# load coming and going: end-to-end tests whose searches must resolve their comparisons do
# without the relative check (tests/test_measure.py tests it; tests of contention set it).
os.environ.setdefault("INLINING_ORCHESTRATOR_SHARE_MARGIN", "1")


@pytest.fixture(scope="session")
def compiler() -> Compiler:
    """The patched compiler (built by compiler/build, or named by $INLINING_COMPILER_PREFIX)."""
    return locate_compiler()


@pytest.fixture
def program(tmp_path):
    """tests.helpers' two-module OCaml program (util.ml, main.ml) in ``tmp_path``."""
    from tests.helpers import MAIN_ML, UTIL_ML
    (tmp_path / "util.ml").write_text(UTIL_ML)
    (tmp_path / "main.ml").write_text(MAIN_ML)
    return tmp_path


@pytest.fixture(scope="session")
def agent_pyz(tmp_path_factory):
    """The worker agent's zipapp, built once a session (the agent's and isolation tests')."""
    from workers.zipapp import build_agent_zipapp
    return build_agent_zipapp(tmp_path_factory.mktemp("agent-pyz"))


@pytest.fixture(scope="session")
def bundled_builds(compiler, tmp_path_factory):
    """Bundled benchmarks, each built once a test run (tests.helpers.BundledBuilds): under
    pytest-xdist in the directory every worker of the run shares (the parent of each
    worker's base temporary directory)."""
    from tests.helpers import BundledBuilds
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker:
        return BundledBuilds(compiler, tmp_path_factory.mktemp("bundled-builds"))
    root = tmp_path_factory.getbasetemp().parent / "bundled-builds"
    return BundledBuilds(compiler, root, int(worker.removeprefix("gw") or 0),
                         int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))


@pytest.fixture(params=["runner threads", "answering slots"])
def both_slot_kinds(request, monkeypatch):
    """A test module's ``Scheduler`` as it is (slots run by its runner threads) and as one
    whose slots answer by themselves (``AnsweringSlot``: runners without a thread), so each
    test that uses it runs over both (``pytestmark = pytest.mark.usefixtures(...)``)."""
    if request.param == "answering slots":
        from tests.helpers import answering_scheduler
        monkeypatch.setattr(request.module, "Scheduler",
                            answering_scheduler(request.module.Scheduler))
    return request.param
