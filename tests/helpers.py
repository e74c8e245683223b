"""Helpers for tests that run the real mlagents-learn CLI, players and ports."""
import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Set

import psutil
import pytest
import yaml

from mlagents_plugin.examples import config_file
from mlagents_plugin.local import processes, rpc_server
from mlagents_plugin.local.processes import every_process
from mlagents_plugin.testing.ports import free_port_block  # noqa: F401  (the tests import it from here)

REPO = Path(__file__).resolve().parents[1]
MLAGENTS_LEARN = str(Path(sys.executable).parent / "mlagents-learn")


def write_config(tmp_path: Path, name: str, edit=None) -> Path:
    """A copy of config/<name> in tmp_path, optionally changed by ``edit(config_dict)``."""
    config = yaml.safe_load(config_file(name).read_text())
    if edit is not None:
        edit(config)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return path


def learn_command(config: Path, *args: str) -> List[str]:
    return [MLAGENTS_LEARN, str(config), "--run-id=run", "--results-dir=results", "--force", *args]


def run_learn(tmp_path: Path, config: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        learn_command(config, *args), cwd=tmp_path, capture_output=True, text=True, timeout=timeout
    )


def scalars(run_dir: Path, behavior: str) -> Dict[str, List[float]]:
    """Every scalar TensorBoard recorded for a behaviour, by tag."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run_dir / behavior), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {tag: [e.value for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def start_learn(tmp_path: Path, command, env: Optional[Dict[str, str]] = None) -> subprocess.Popen:
    return subprocess.Popen(
        command,
        cwd=tmp_path,
        env=None if env is None else {**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # its own process group, like a job in a terminal; SIGINT and SIGHUP are not ignored
        # whatever started the suite (conftest's pytest_configure)
        start_new_session=True,
    )


def wait_for_line(trainer: subprocess.Popen, text: str, output: list, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    for line in trainer.stdout:
        output.append(line)
        if text in line:
            return
        if time.monotonic() > deadline:
            break
    pytest.fail(f"never saw {text!r}:\n{''.join(output)[-6000:]}")


def kill(trainer: subprocess.Popen) -> None:
    """SIGKILL to the trainer's process group; on Windows, which has no process groups to
    signal, TerminateProcess to it and every process under it."""
    if sys.platform != "win32":
        os.killpg(trainer.pid, signal.SIGKILL)
        return
    try:
        root = psutil.Process(trainer.pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    processes.kill_processes(tree, 0.0)  # terminate() is TerminateProcess there


def finish(trainer: subprocess.Popen, output: list, timeout_s: float) -> float:
    """Wait (bounded) for the trainer to exit; return how long it took."""
    started = time.monotonic()
    try:
        rest, _ = trainer.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill(trainer)
        rest, _ = trainer.communicate()
        output.append(rest)
        pytest.fail(f"mlagents-learn did not exit within {timeout_s} s:\n{''.join(output)[-6000:]}")
    output.append(rest)
    return time.monotonic() - started


def step_until(manager, condition, within_s: float = 60.0) -> None:
    """Call ``manager.get_steps()`` until ``condition()``; fail (never hang) after ``within_s``."""
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"condition not reached within {within_s} s of get_steps")
        manager.get_steps()


def processes_naming(path: Path) -> List[int]:
    """Live processes whose command line names ``path`` (players, envs of this test's folder)."""
    found = []
    for proc in every_process():
        try:
            if str(path) in " ".join(proc.cmdline()) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except psutil.Error:
            pass
    return found


def wait_for_files(directory: Path, names, within_s: float = 30.0) -> None:
    """Until every one of ``names`` exists in ``directory`` (a faulty env's ``fired_dir``, say)."""
    deadline = time.monotonic() + within_s
    while not all((directory / str(name)).exists() for name in names):
        if time.monotonic() > deadline:
            pytest.fail(f"{sorted(p.name for p in directory.iterdir())} in {directory}, never all of {names}")
        time.sleep(0.02)


def alive_after(pids, grace_s: float):
    """The pids still running (not zombies) after up to ``grace_s``."""
    deadline = time.monotonic() + grace_s
    while True:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def reaper_of(supervisor_pid: int) -> psutil.Process:
    """The reaper a supervising process started (NOTE [ The reaper ]): not its child, so found
    by its command line."""
    from mlagents_plugin.local.linux import reaper

    deadline = time.monotonic() + 10  # a fresh reaper shows up at once; a loaded machine may lag
    while True:
        reapers = []
        for proc in every_process():
            try:
                command = proc.cmdline()
                if command[3:4] == [reaper.__file__] and proc.status() != psutil.STATUS_ZOMBIE:
                    reapers.append((proc, json.loads(command[4])["supervisor"]))
            except (psutil.Error, IndexError, ValueError):
                continue
        for proc, supervisor in reapers:
            if supervisor == supervisor_pid:
                return proc
        if time.monotonic() > deadline:
            pytest.fail(f"process {supervisor_pid} has no reaper; reapers of: {[s for _, s in reapers]}")
        time.sleep(0.1)


SPAWN_ONLY = pytest.mark.skipif(
    sys.platform == "win32", reason="fork and forkserver do not exist on Windows: multiprocessing starts processes "
    "there by spawn only, the start method Windows users get"
)

# psutil lists other processes' sockets on macOS only to root; there a port's holder cannot be
# named, and the product says "in use" or "another process" instead (local/processes.port_holder).
HOLDERS_VISIBLE = sys.platform != "darwin" or os.geteuid() == 0


class KillOnceBusy:
    """Kill ``pid`` (SIGKILL; TerminateProcess on Windows) from a thread once it has spent ``cpu_s``
    more CPU than now: mid-run however fast or slow the machine is (a wall-clock timer may fire
    after the run has ended).
    ``cancel()`` stops it; ``fired`` says whether it killed."""

    def __init__(self, pid: int, cpu_s: float = 0.1):
        import threading

        self.process = psutil.Process(pid)
        self.until = sum(self.process.cpu_times()[:2]) + cpu_s
        self.stop = threading.Event()
        self.fired = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.stop.wait(0.02):
                if sum(self.process.cpu_times()[:2]) >= self.until:
                    self.process.kill()
                    self.fired = True
                    return
        except psutil.Error:
            pass  # gone already

    def cancel(self) -> None:
        self.stop.set()
        self.thread.join(5.0)


class Listener(NamedTuple):
    ip: str
    port: int
    pid: int


def listeners(root_pid: int) -> List[Listener]:
    """Every listening TCP socket of ``root_pid`` and its descendants (workers, players)."""
    root = psutil.Process(root_pid)
    found = []
    for proc in [root] + root.children(recursive=True):
        try:
            sockets = proc.net_connections(kind="inet")
        except psutil.Error:
            continue  # gone meanwhile
        found += [Listener(_plain(s.laddr.ip), s.laddr.port, proc.pid)
                  for s in sockets if s.status == psutil.CONN_LISTEN]
    return found


def _plain(ip: str) -> str:
    """gRPC binds an IPv4 address on an IPv6 socket: ``::ffff:127.0.0.1`` is ``127.0.0.1``."""
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped or address)


def loopback_families() -> Set[str]:
    """Where a worker listens by default: 127.0.0.1, and ::1 where this machine has it."""
    return {"127.0.0.1", "::1"} if rpc_server.has_ipv6_loopback() else {"127.0.0.1"}


def listeners_on(root_pid: int, want: Dict[int, Set[str]], trainer, within_s: float = 120.0) -> List[Listener]:
    """The run's listeners, once each port of ``want`` listens on its addresses (or at the deadline:
    the caller's assertions then say what differs)."""
    deadline = time.monotonic() + within_s
    while True:
        found = listeners(root_pid)
        if all({s.ip for s in found if s.port == port} == ips for port, ips in want.items()):
            return found
        if trainer.poll() is not None or time.monotonic() > deadline:
            return found
        time.sleep(0.2)
