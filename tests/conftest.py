"""Shared test plumbing: every test must leave no process, and no shared memory, behind, and the
run no fork server temp dir; the Ray tests share one loopback Ray cluster, watched by netguard
where it exists."""
import importlib.util
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, List

import psutil
import pytest

from mlagents_plugin.core import signals, wire
from mlagents_plugin.local import fork_server, processes

# multiprocessing's own long-lived helpers, started once per test process and shared by tests:
# the fork server (fresh, or a fork of this process, which fork_server.running_pid names) and
# the resource tracker. (The process's reaper is not a descendant: NOTE [ No orphans ].)
_HELPERS = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")
# The session's Ray cluster and the pool of idle Ray workers it keeps: not a test's leftovers.
# (Our actors, titled ray::EnvHostActor, are; tests/test_ray.py checks them by pid too.)
_RAY_PROCESS_TITLES = ("ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent")


def _infrastructure(proc: psutil.Process, me: int) -> bool:
    cmdline = " ".join(proc.cmdline())
    if proc.ppid() == me and (any(h in cmdline for h in _HELPERS) or proc.pid == fork_server.running_pid()):
        return True
    return "/site-packages/ray/" in cmdline or cmdline.startswith(_RAY_PROCESS_TITLES)


def leftover_processes() -> List[psutil.Process]:
    """This process's descendants, minus multiprocessing's helpers, plus any orphan we tagged."""
    me = psutil.Process()
    found = {}
    for child in me.children(recursive=True):
        try:
            if _infrastructure(child, me.pid):
                continue
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.Error:
            continue
        found[child.pid] = child
    for orphan in processes.find_tagged(f"mlagents-plugin/{os.getpid()}-"):
        found[orphan.pid] = orphan
    return list(found.values())


def leftover_segments() -> List[str]:
    """Shared memory segments of managers this process created (core/wire.py). Linux lists them in
    /dev/shm; macOS and Windows keep them nowhere a process can list."""
    if sys.platform != "linux":
        return []
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"{wire.SEGMENT_PREFIX}{os.getpid()}_")]


def new_leftovers(before: set, grace_s: float = 2.0, ray_grace_s: float = 10.0) -> List[psutil.Process]:
    """Processes that appeared since `before` and are still alive after `grace_s`.

    The grace covers processes already killed but still exiting: mlagents-envs' own close
    SIGKILLs a build that does not quit and does not wait for it. A Ray actor whose driver has
    gone (a benchmark run on the session's Ray) is killed by Ray asynchronously: it gets
    `ray_grace_s`."""
    started = time.monotonic()
    while True:
        left = [p for p in leftover_processes() if p.pid not in before]
        waited = time.monotonic() - started
        if not left or waited > (ray_grace_s if any(_is_ray_actor(p) for p in left) else grace_s):
            return left
        time.sleep(0.05)


def _is_ray_actor(process: psutil.Process) -> bool:
    try:
        return process.name().startswith("ray::") or " ".join(process.cmdline()).startswith("ray::")
    except psutil.Error:
        return False


def pytest_configure(config) -> None:
    """Before the test modules are imported: check the slots' invariants after every pump
    (core/lifecycle.py), here and in every mlagents-learn the tests start. The Python 3.10 leg
    tests the installed wheel: make sure it is what is imported, not this checkout."""
    os.environ["MLAGENTS_PLUGIN_CHECK"] = "1"
    _as_a_terminal_job()
    if os.environ.get("MLAGENTS_PLUGIN_EXPECT_INSTALLED") == "1":
        import mlagents_plugin

        if Path(mlagents_plugin.__file__).resolve().parents[1] == Path(__file__).resolve().parents[1]:
            pytest.exit(f"mlagents_plugin comes from this checkout ({mlagents_plugin.__file__}), not the wheel", 2)


def pytest_collection_modifyitems(config, items) -> None:
    """The Linux hardening's own tests (pytest.ini's ``hardening`` marker) import it: off Linux they
    are skipped, saying so, and the rest of their files run (the portable leg deselects them)."""
    if sys.platform == "linux":
        return
    linux_only = pytest.mark.skip(reason="tests the Linux hardening (reaper, parent-death signal, pidfd watch), "
                                  "which only Linux has: macOS and Windows take the portable path")
    for item in items:
        if item.get_closest_marker("hardening") is not None:
            item.add_marker(linux_only)


def _as_a_terminal_job() -> None:
    """The suite tests Ctrl-C and hangups as a terminal delivers them, so it runs as a terminal job
    does, whatever started it: a runner started in the background (``cmd &`` in a script),
    under ``nohup``, or by a CI agent may pass SIGINT or SIGHUP on ignored, and Python and
    mlagents-learn keep an inherited ignored signal ignored (CI19: every Ctrl-C test failed)."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if sys.platform != "win32" and signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:  # Windows has no SIGHUP
        signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.fixture(autouse=True)
def no_leftovers():
    before = {p.pid for p in leftover_processes()}
    segments_before = set(leftover_segments())
    yield
    left = new_leftovers(before)
    described = []
    for proc in left:  # do not let one test's leak fail the next ones too
        try:
            described.append(f"pid {proc.pid}: {' '.join(proc.cmdline())[:120]}")
            proc.kill()
        except psutil.Error:
            pass
    segments = sorted(set(leftover_segments()) - segments_before)
    for name in segments:
        os.unlink(os.path.join("/dev/shm", name))
    assert not described, f"processes left behind: {described}"
    assert not segments, f"shared memory left behind: {segments}"


_SESSION_START = time.time()


def abandoned_temp_dirs(since: float) -> List[str]:
    """multiprocessing's temp dirs (``pymp-*``, where a fork server's socket lives) made since
    ``since`` whose fork server is gone while the dir stays: only a living trainer removes its
    own (at exit), and its reaper after a SIGKILL. A dir whose socket is still bound is in use
    (/proc/net/unix: Linux only, where the Linux hardening's reaper is checked)."""
    if sys.platform != "linux":
        return []
    with open("/proc/net/unix") as f:
        bound = {line.split()[-1] for line in f.read().splitlines()[1:] if len(line.split()) > 7}
    found = []
    for root in {tempfile.gettempdir(), "/tmp"}:
        for path in Path(root).glob("pymp-*"):
            try:
                sockets = [str(s) for s in path.glob("listener-*")]
                if path.stat().st_mtime >= since and sockets and not bound.intersection(sockets):
                    found.append(str(path))
            except OSError:  # removed meanwhile
                continue
    return found


@pytest.hookimpl(hookwrapper=True)
def pytest_sessionfinish(session):
    """After the whole run (with xdist: in the controller, once its workers are gone): no test
    may leave a fork server's temp dir behind. Each test process's own goes when it exits."""
    yield
    if hasattr(session.config, "workerinput"):
        return
    deadline = time.monotonic() + 10.0  # reapers and exiting processes finish their clean-up
    while (left := abandoned_temp_dirs(_SESSION_START)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_sep("=", f"fork server temp dirs left behind by the run: {left}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def no_stop_signal_yet(monkeypatch):
    """Each test starts as a trainer that has received no Ctrl-C (NOTE [ Trainer signals ])."""
    monkeypatch.setattr(signals, "_interrupts", 0)
    monkeypatch.setattr(signals, "_raised", None)


class ProcessStartedInFastTest(AssertionError):
    pass


@pytest.fixture(autouse=True)
def fast_tests_start_no_process(request, monkeypatch):
    """A ``fast`` test runs in this process alone: every way of starting a process fails it."""
    if request.node.get_closest_marker("fast") is None:
        yield
        return
    import multiprocessing.process
    import multiprocessing.util
    import subprocess
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()  # multiprocessing's helper, shared by every test: not the test's

    def refuse(*args, **kwargs):
        raise ProcessStartedInFastTest(f"{request.node.nodeid} is marked fast but starts a process")

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
    monkeypatch.setattr(multiprocessing.util, "spawnv_passfds", refuse)
    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, refuse)
    yield


# ------------------------------------------------------------------------------- Ray

# netguard refuses and logs any non-loopback connect from Python processes that load it. It is
# a file of this workplace, not of the project: used where it exists, never needed.
NETGUARD_DIR = Path(os.environ.get("NETGUARD_DIR", Path(__file__).resolve().parents[2] / "shared" / "netguard"))


class RayTestCluster:
    """The session's Ray: a loopback ``Cluster`` (NOTE [ Ray on loopback ]) this process drives."""

    def __init__(self, cluster, netguard_log: Path):
        self.cluster = cluster
        self.netguard_log = netguard_log

    @property
    def address(self) -> str:
        return self.cluster.address

    def add_node(self, **kwargs):
        return self.cluster.add_node(node_ip_address="127.0.0.1", **kwargs)

    def assert_no_outside_connects(self) -> None:
        _assert_empty(self.netguard_log)


def _assert_empty(netguard_log: Path) -> None:
    if netguard_log.exists():
        blocked = netguard_log.read_text()
        assert not blocked, f"netguard blocked non-loopback connects:\n{blocked[:3000]}"


EDITOR_PORT = 5004  # where mlagents-learn waits for the Unity Editor, whatever --base-port says
_EDITOR_PORT_LOCK = Path(tempfile.gettempdir()) / "mlagents-plugin-tests-editor-port.lock"


@pytest.fixture
def editor_port() -> Iterator[int]:
    """The Editor's one port, for one test at a time: across xdist workers (pytest-xdist 3.8's
    loadgroup does not group tests under pytest 9, so xdist_group alone let two such tests meet
    on 5004 in CI) and across test sessions on the machine."""
    from mlagents_plugin.testing.faulty_envs import locked  # flock, or msvcrt's locking on Windows

    with open(_EDITOR_PORT_LOCK, "w") as lock, locked(lock):  # held for seconds; pytest-timeout bounds the wait
        yield EDITOR_PORT


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory) -> Iterator[RayTestCluster]:
    """Started once per xdist worker that runs Ray tests (their xdist_group "ray" would put them
    all on one, but pytest-xdist 3.8's loadgroup does not group under pytest 9)."""
    from mlagents_plugin.ray import local as ray_local

    netguard_log = tmp_path_factory.mktemp("netguard") / "netguard.log"
    if (NETGUARD_DIR / "sitecustomize.py").exists():
        os.environ["NETGUARD_LOG"] = str(netguard_log)
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(NETGUARD_DIR), os.environ.get("PYTHONPATH")]))
        spec = importlib.util.spec_from_file_location("netguard_sitecustomize", NETGUARD_DIR / "sitecustomize.py")
        spec.loader.exec_module(importlib.util.module_from_spec(spec))  # guard this process too
    with ray_local.loopback_cluster(num_cpus=8) as cluster:
        yield RayTestCluster(cluster, netguard_log)
    _assert_empty(netguard_log)  # Ray's processes have all stopped: nothing more can be logged


@pytest.fixture
def ml_agents_hooks(monkeypatch):
    """For tests that call plugin.register(): put back every module attribute it replaces."""
    from mlagents.trainers import learn
    from mlagents.trainers import settings as mla_settings
    from mlagents.trainers.torch_entities import model_serialization

    for owner, name in [
        (mla_settings, "load_config"),
        (mla_settings, "check_hyperparam_schedules"),
        (learn, "SubprocessEnvManager"),
        (learn, "write_run_options"),
        (model_serialization.ModelSerializer, "export_policy_model"),
    ]:
        monkeypatch.setattr(owner, name, getattr(owner, name))
