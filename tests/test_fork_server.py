"""The fork server a user's own script gets (NOTE [ A fork server forked from the trainer ]): a
fork of the trainer only where that is safe, its death its own fault, and env logging arriving
where it arrives under upstream's forked workers. Each runs a trainer script of its own: the
choice of server is made once per process."""
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import alive_after

# An env whose step runs a torch op that ATen splits over its intra-op (OpenMP) pool.
TORCH_ENV = textwrap.dedent("""
    import torch
    from mlagents_plugin.testing import SimpleEnvironment
    class TorchEnv(SimpleEnvironment):
        def step(self):
            (torch.ones(200_000) * 2).sum()
            super().step()
    def make_env(worker_id, side_channels):
        return TorchEnv(worker_id, side_channels)
""")

TORCH_TRAINER = textwrap.dedent("""
    import sys
    import torch
    from mlagents.trainers.settings import RunOptions
    from mlagents_plugin import EnvManagerSettings, SupervisedEnvManager
    from mlagents_plugin.local import fork_server
    import torch_env  # beside this script
    if __name__ == "__main__":
        if sys.argv[1] == "threads":  # the pool starts: a fork would copy it without its threads
            torch.set_num_threads(4)
            (torch.ones(200_000) * 2).sum()
        manager = SupervisedEnvManager(torch_env.make_env, RunOptions(), 2, EnvManagerSettings(step_timeout_s=15))
        manager.reset()
        steps = 0
        while steps < 20:
            steps += len(manager.get_steps())
        print("trained;", fork_server.describe(), flush=True)
        manager.close()
""")

# Without a BLAS or OpenMP pool (numpy's OpenBLAS starts one at import on any machine of more
# than one core), the trainer is a single thread and the fork server is a fork of it; with
# torch's pool started, whatever the machine, it runs native threads and the server is fresh.
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
POOL_STARTED = "import torch; torch.set_num_threads(2); (torch.ones(200_000) * 2).sum()"


def run_script(folder: Path, script: str, *args: str, one_thread: bool, timeout: float = 100):
    path = folder / "trainer.py"
    path.write_text(script)
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    return subprocess.run(
        [sys.executable, str(path), *args], cwd=folder, capture_output=True, text=True, timeout=timeout,
        env={**env, **ONE_THREAD} if one_thread else env,
    )


@pytest.mark.timeout(150)
@pytest.mark.parametrize("trainer", ["threads", "one thread"])
def test_a_torch_env_trains_after_the_trainer_started_torchs_threads(tmp_path, trainer):
    """Issue 32: a script that ran torch on 4 threads, then a torch env: a fork of it hung every
    worker at its first torch op, restarts included. It now gets a fresh fork server; a trainer
    that started no native thread is still forked."""
    (tmp_path / "torch_env.py").write_text(TORCH_ENV)
    run = run_script(tmp_path, TORCH_TRAINER, trainer, one_thread=trainer == "one thread")
    assert run.returncode == 0, run.stderr[-3000:]
    if trainer == "threads":
        fresh = r"trained; a fresh fork server \(pid \d+\), not a fork of this process: it runs \d+ native"
        assert re.search(fresh, run.stdout)
    else:
        assert re.search(r"trained; a fork server forked from this process \(pid \d+\)$", run.stdout.strip())


SERVER_KILLER = textwrap.dedent("""
    import os, signal, sys, time
    from mlagents.trainers.settings import RunOptions
    from mlagents_plugin import EnvManagerSettings, SupervisedEnvManager
    from mlagents_plugin.local import fork_server
    from mlagents_plugin.testing import make_factory

    def until_replaced(manager, pids, deadline_s=60):
        deadline = time.monotonic() + deadline_s
        while set(manager.worker_pids.values()) & set(pids):
            assert time.monotonic() < deadline, "not replaced"
            manager.get_steps()

    if __name__ == "__main__":
        server_made, deaths_free = sys.argv[1], sys.argv[2] == "free"
        if server_made == "fresh":
            exec(sys.argv[3])  # a native thread pool: no fork of this process
        if not deaths_free:  # as after FREE_DEATHS deaths in this process
            fork_server.FREE_DEATHS = 0
        run_options = RunOptions()
        run_options.env_settings.max_lifetime_restarts = 1  # one fault per worker, not more
        manager = SupervisedEnvManager(make_factory(), run_options, 3, EnvManagerSettings())
        manager.reset()
        server, workers = fork_server.running_pid(), list(manager.worker_pids.values())
        print("server", server, *workers, flush=True)
        os.kill(server, signal.SIGKILL)
        until_replaced(manager, workers)
        print("new server", fork_server.running_pid(), fork_server.describe(), flush=True)
        victim = manager.worker_pids[0]
        os.kill(victim, signal.SIGKILL)  # an ordinary fault: the worker's one restart
        until_replaced(manager, [victim])
        for _ in range(20):
            manager.get_steps()
        print("trained", flush=True)
        manager.close()
""")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("server", ["forked", "fresh"])
def test_the_fork_servers_death_is_its_own_fault_and_charges_no_worker(tmp_path, server):
    """Issue 32: SIGKILL of the fork server blamed every worker ("exited with code 255") and
    charged each a restart, so the next ordinary fault ended the run with "has no restarts
    left". Now it is named once, its workers are started again from a fresh server (never a
    fork of the trainer again), uncounted, and none of them is left running."""
    run = run_script(tmp_path, SERVER_KILLER, server, "free", POOL_STARTED, one_thread=server == "forked")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    lines = [line for line in run.stdout.splitlines() if line.startswith(("server", "new server", "trained"))]
    old_server, *old_workers = map(int, lines[0].split()[1:])
    assert lines[-1] == "trained"
    assert f"The fork server (pid {old_server}) was killed by SIGKILL" in run.stderr + run.stdout
    assert "without counting as restarts" in run.stderr + run.stdout
    assert "code 255" not in run.stderr + run.stdout
    new_server = int(lines[1].split()[2])
    assert new_server != old_server
    assert lines[1].startswith(f"new server {new_server} a fresh fork server (pid {new_server})")
    assert "not a fork of this process: a fork server of this process died" in lines[1]
    assert alive_after(old_workers, 5.0) == []


@pytest.mark.timeout(150)
def test_a_fork_server_that_dies_too_often_costs_its_workers_restarts(tmp_path):
    """Past FREE_DEATHS deaths in a process (here none), a fork server killed again and again is
    a fault like any: each worker lost with it counts as a restart, and the quota of one is gone
    by the next ordinary fault."""
    run = run_script(tmp_path, SERVER_KILLER, "fresh", "counted", POOL_STARTED, one_thread=False)
    assert run.returncode != 0
    assert "so each counts as a restart" in run.stderr + run.stdout
    assert "has no restarts left" in run.stderr, run.stderr[-3000:]


LOGGING_ENV = textwrap.dedent("""
    import logging
    from mlagents_plugin.testing import SimpleEnvironment
    class LoggingEnv(SimpleEnvironment):
        def reset(self):
            logging.getLogger("user.env").warning("a warning from the env's reset")
            return super().reset()
    def make_env(worker_id, side_channels):
        return LoggingEnv(worker_id, side_channels)
""")

LOGGING_TRAINER = textwrap.dedent("""
    import logging, sys
    from mlagents.trainers.settings import RunOptions
    from mlagents_plugin import EnvManagerSettings, SupervisedEnvManager
    import logging_env  # beside this script
    if __name__ == "__main__":
        exec(sys.argv[3])  # for a fresh server: a native thread pool
        logging.basicConfig(filename=sys.argv[2], level=logging.INFO)
        settings = EnvManagerSettings(start_method=sys.argv[1])
        manager = SupervisedEnvManager(logging_env.make_env, RunOptions(), 2, settings)
        manager.reset()
        manager.close()
""")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("start", ["forked server", "fresh server", "spawn", "fork"])
def test_an_envs_log_records_reach_the_trainers_handlers_or_its_stderr(tmp_path, start):
    """Issue 32: the forked server pointed every inherited descriptor at /dev/null, the user's
    FileHandler's too, and an env's warnings reached nothing. As upstream's workers: forks (the
    forked server's too) write to the trainer's log file; spawned ones, and a fresh server's,
    which have no logging set up, print warnings on stderr."""
    (tmp_path / "logging_env.py").write_text(LOGGING_ENV)
    log = tmp_path / "trainer.log"
    method = "forkserver" if start.endswith("server") else start
    pool = POOL_STARTED if start == "fresh server" else "pass"
    run = run_script(tmp_path, LOGGING_TRAINER, method, str(log), pool, one_thread=start == "forked server")
    assert run.returncode == 0, run.stderr[-3000:]
    in_file = log.read_text().count("a warning from the env's reset")
    on_stderr = run.stderr.count("a warning from the env's reset")
    # each worker resets its env when it starts and again for the manager's reset
    if start in ("forked server", "fork"):
        assert (in_file, on_stderr) == (4, 0)
    else:
        assert (in_file, on_stderr) == (0, 4)
