"""The things a benchmark steps side by side, behind one small interface.

Each stepper steps ``n`` envs built by the same factory, without a policy (empty actions), and
returns as soon as at least one env has stepped, as ML-Agents' env managers do:

- ``ours``: SupervisedEnvManager;
- ``upstream``: ML-Agents' SubprocessEnvManager;
- ``in-process``: the env stepped in the trainer process, as ML-Agents' SimpleEnvManager does;
- ``raw pipe``: the floor: forkserver processes that step the env and send the same step
  results through a bare ``multiprocessing.Pipe``; the trainer waits on all pipes at once.
"""
import multiprocessing
from multiprocessing.connection import Connection, wait
from typing import Callable, Dict, List, Tuple

from mlagents.trainers.env_manager import EnvManager
from mlagents.trainers.settings import RunOptions
from mlagents.trainers.subprocess_env_manager import SubprocessEnvManager

from mlagents_plugin.core.settings import EnvManagerSettings
from mlagents_plugin.local.supervisor import SupervisedEnvManager

Factory = Callable[..., object]


class Stepper:
    name = ""

    def step(self) -> Tuple[int, int]:
        """Step; return (env steps, agent steps) that came back."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class ManagerStepper(Stepper):
    def __init__(self, name: str, manager: EnvManager):
        self.name = name
        self.manager = manager
        manager.reset({})  # upstream cannot take None

    def step(self) -> Tuple[int, int]:
        steps = self.manager.get_steps()
        agents = sum(len(d) + len(t) for s in steps for d, t in s.current_all_step_result.values())
        return len(steps), agents

    def close(self) -> None:
        self.manager.close()


def _raw_worker(conn: Connection, factory: Factory, worker_id: int) -> None:
    env = factory(worker_id, [])
    env.reset()
    while conn.recv() is not None:
        env.step()
        conn.send({name: env.get_steps(name) for name in env.behavior_specs})


class RawPipeStepper(Stepper):
    name = "raw pipe"

    def __init__(self, factory: Factory, n_env: int):
        context = multiprocessing.get_context("forkserver")
        self.conns: List[Connection] = []
        self.processes = []
        for worker_id in range(n_env):
            parent, child = context.Pipe()
            process = context.Process(target=_raw_worker, args=(child, factory, worker_id))
            process.start()
            child.close()
            self.conns.append(parent)
            self.processes.append(process)
        self.idle = list(self.conns)

    def step(self) -> Tuple[int, int]:
        for conn in self.idle:
            conn.send(1)
        self.idle = wait(self.conns)
        agents = 0
        for conn in self.idle:
            agents += sum(len(d) + len(t) for d, t in conn.recv().values())
        return len(self.idle), agents

    def close(self) -> None:
        for conn in self.conns:
            if conn in self.idle:
                conn.send(None)
        for process in self.processes:
            process.kill()
            process.join()


def stepper_makers(names: List[str], factory: Factory, n_env: int) -> List[Callable[[], Stepper]]:
    makers: Dict[str, Callable[[], Stepper]] = {
        "ours": lambda: ManagerStepper(
            "ours", SupervisedEnvManager(factory, RunOptions(), n_env, EnvManagerSettings())
        ),
        "upstream": lambda: ManagerStepper("upstream", SubprocessEnvManager(factory, RunOptions(), n_env)),
        "raw pipe": lambda: RawPipeStepper(factory, n_env),
        "in-process": lambda: InProcessStepper(factory),
    }
    return [makers[name] for name in names if name != "in-process" or n_env == 1]


class InProcessStepper(Stepper):
    """What ML-Agents' SimpleEnvManager does per step, minus the policy it insists on."""

    name = "in-process"

    def __init__(self, factory: Factory):
        self.env = factory(0, [])
        self.env.reset()

    def step(self) -> Tuple[int, int]:
        self.env.step()
        results = {name: self.env.get_steps(name) for name in self.env.behavior_specs}
        return 1, sum(len(d) + len(t) for d, t in results.values())

    def close(self) -> None:
        self.env.close()
