"""The things a benchmark steps side by side, behind one small interface, and the one pipe
baseline that the ``throughput`` and ``trainer`` sections both measure against.

Each stepper steps ``n`` envs built by the same factory and returns as soon as at least one env
has stepped, as ML-Agents' env managers do. ``stepper_makers`` (``throughput``) steps them with
no policy (empty actions); trainer_loop.py drives the same managers in the trainer's loop:

- ``ours``: SupervisedEnvManager;
- ``upstream``: ML-Agents' SubprocessEnvManager;
- ``in-process``: the env stepped in the trainer process, as ML-Agents' SimpleEnvManager does;
- ``bare pipe`` (``BARE_PIPE``): the floor, ``BarePipeEnvManager``: forks of the trainer (as
  upstream's workers, the cheapest start) and a bare ``multiprocessing.Pipe`` each, carrying the
  step's arrays one way and the actions' arrays the other; the trainer waits on all pipes at
  once, and calls the policy, where there is one, per worker, as upstream's ``_take_step`` does.
  (``throughput`` tables recorded before this one pipe name it ``raw pipe``: docs/benchmarks.md.)
"""
import multiprocessing
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Dict, List, Optional, Tuple

from mlagents.trainers.action_info import ActionInfo
from mlagents.trainers.env_manager import EnvironmentStep, EnvManager
from mlagents.trainers.settings import RunOptions
from mlagents.trainers.subprocess_env_manager import SubprocessEnvManager
from mlagents_envs.base_env import ActionTuple, BehaviorSpec, DecisionSteps, TerminalSteps

from mlagents_plugin.core.settings import EnvManagerSettings
from mlagents_plugin.local.supervisor import SupervisedEnvManager

Factory = Callable[..., object]
BARE_PIPE = "bare pipe"


class Stepper:
    name = ""

    def step(self) -> Tuple[int, int]:
        """Step; return (env steps, agent steps) that came back."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


def agent_steps(steps: List[EnvironmentStep]) -> int:
    """How many agents' steps (decision and terminal) came back in ``steps``."""
    return sum(len(d) + len(t) for s in steps for d, t in s.current_all_step_result.values())


class ManagerStepper(Stepper):
    """An env manager, reset once, then stepped with ``get_steps``; closed if its reset fails."""

    def __init__(self, name: str, manager: EnvManager):
        self.name = name
        self.manager = manager
        try:
            self._start()
        except BaseException:
            manager.close()
            raise

    def _start(self) -> None:
        self.manager.reset({})  # upstream cannot take None

    def step(self) -> Tuple[int, int]:
        steps = self.manager.get_steps()
        return len(steps), agent_steps(steps)

    def close(self) -> None:
        self.manager.close()


# --------------------------------------------------------------------------- the bare pipe


StepArrays = Tuple[Any, ...]  # a DecisionSteps' six fields, then a TerminalSteps' six


def _arrays(decision: DecisionSteps, terminal: TerminalSteps) -> StepArrays:
    return (
        decision.obs, decision.reward, decision.agent_id, decision.action_mask, decision.group_id,
        decision.group_reward, terminal.obs, terminal.reward, terminal.interrupted, terminal.agent_id,
        terminal.group_id, terminal.group_reward,
    )


def _bare_worker(conn: Connection, factory: Factory, worker_id: int) -> None:
    env: Any = factory(worker_id, [])
    try:
        while True:
            message = conn.recv()
            if message is None:
                return
            if message == "reset":
                env.reset()
            else:
                for name, (continuous, discrete) in message.items():
                    env.set_actions(name, ActionTuple(continuous, discrete))
                env.step()
            results = {name: _arrays(*env.get_steps(name)) for name in env.behavior_specs}
            conn.send((dict(env.behavior_specs) if message == "reset" else None, results))
    finally:
        env.close()


class BarePipeEnvManager(EnvManager):
    """What an env manager cannot do with less: a pipe per worker, arrays each way."""

    def __init__(self, factory: Factory, n_env: int):
        super().__init__()
        context = multiprocessing.get_context("fork")
        self.conns: List[Connection] = []
        self.processes = []
        for worker_id in range(n_env):
            parent, child = context.Pipe()
            process = context.Process(target=_bare_worker, args=(child, factory, worker_id), daemon=True)
            process.start()
            child.close()
            self.conns.append(parent)
            self.processes.append(process)
        self.specs: Dict[str, BehaviorSpec] = {}
        self.previous: List[EnvironmentStep] = []
        self.sent: Dict[int, Dict[str, ActionInfo]] = {}  # worker id -> the actions it steps with

    def _reset_env(self, config: Optional[Dict] = None) -> List[EnvironmentStep]:
        for conn in self.conns:
            conn.send("reset")
        self.previous = [self._received(worker_id, {}) for worker_id in range(len(self.conns))]
        self.sent = {}
        return list(self.previous)

    def _step(self) -> List[EnvironmentStep]:
        for worker_id, conn in enumerate(self.conns):
            if worker_id in self.sent:
                continue
            last = self.previous[worker_id]
            infos = {
                name: self.policies[name].get_action(decision, worker_id)
                for name, (decision, _) in last.current_all_step_result.items()
                if name in self.policies
            }
            conn.send({name: (i.env_action.continuous, i.env_action.discrete) for name, i in infos.items()})
            self.sent[worker_id] = infos
        steps = []
        for conn in wait([self.conns[worker_id] for worker_id in self.sent]):
            worker_id = self.conns.index(conn)  # type: ignore[arg-type]
            steps.append(self._received(worker_id, self.sent.pop(worker_id)))
        return steps

    def _received(self, worker_id: int, infos: Dict[str, ActionInfo]) -> EnvironmentStep:
        specs, results = self.conns[worker_id].recv()
        self.specs.update(specs or {})
        decoded = {name: (DecisionSteps(*a[:6]), TerminalSteps(*a[6:])) for name, a in results.items()}
        step = EnvironmentStep(decoded, worker_id, infos, {})
        if self.previous:
            self.previous[worker_id] = step
        return step

    def set_env_parameters(self, config: Optional[Dict] = None) -> None:
        pass

    @property
    def training_behaviors(self) -> Dict[str, BehaviorSpec]:
        return self.specs

    def close(self) -> None:
        for worker_id, conn in enumerate(self.conns):
            try:
                if worker_id in self.sent and conn.poll(5):
                    conn.recv()  # the step it is busy with
                conn.send(None)
            except (OSError, EOFError):
                pass  # gone already: killed below
        for process in self.processes:
            process.join(timeout=5)
            process.kill()
            process.join()


# ------------------------------------------------------------------------------ the others


def stepper_makers(names: List[str], factory: Factory, n_env: int) -> List[Callable[[], Stepper]]:
    makers: Dict[str, Callable[[], Stepper]] = {
        "ours": lambda: ManagerStepper(
            "ours", SupervisedEnvManager(factory, RunOptions(), n_env, EnvManagerSettings())
        ),
        "upstream": lambda: ManagerStepper("upstream", SubprocessEnvManager(factory, RunOptions(), n_env)),
        BARE_PIPE: lambda: ManagerStepper(BARE_PIPE, BarePipeEnvManager(factory, n_env)),
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
