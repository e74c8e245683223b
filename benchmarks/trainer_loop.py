"""Env managers driven as ML-Agents' TrainerController drives them, side by side with a bare pipe.

Each manager gets, per behaviour, ML-Agents' TorchPolicy (PPO's actor, as ``network_settings``
of the training harness: one layer of 32) and an AgentManager; the loop is TrainerController's
``advance`` without the trainer's update: ``get_steps`` (the policy picks every idle worker's
actions, which are sent), ``process_steps`` (the experiences go into the AgentManager, which
builds trajectories), and the trajectories are taken off its queue and dropped.

- ``ours``: SupervisedEnvManager (batched inference: one forward pass for every idle worker);
- ``ours per worker``: the same with ``batch_inference: false`` (one pass per worker, as upstream);
- ``upstream``: ML-Agents' SubprocessEnvManager;
- ``bare pipe``: the floor: forks of the trainer (as upstream's workers, the cheapest start) and a
  bare ``multiprocessing.Pipe`` each, carrying the step's arrays one way and the actions' arrays the
  other; the policy is called per worker, as upstream's ``_take_step`` does.

Two figures per case: the steady state (alternating slices after a warm-up: env steps/s and
the trainer's CPU per env step) and the whole run (construction, first reset, ``WHOLE_RUN_STEPS``
env steps per worker, close: seconds of wall time, median of alternating rounds).
"""
import multiprocessing
import statistics
import time
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Dict, List, Optional, Tuple

from harness import Scenario, side_by_side
from mlagents.trainers.action_info import ActionInfo
from mlagents.trainers.agent_processor import AgentManager, AgentManagerQueue
from mlagents.trainers.env_manager import EnvironmentStep, EnvManager
from mlagents.trainers.policy.torch_policy import TorchPolicy
from mlagents.trainers.settings import NetworkSettings, RunOptions
from mlagents.trainers.stats import StatsReporter
from mlagents.trainers.subprocess_env_manager import SubprocessEnvManager
from mlagents.trainers.torch_entities.networks import SimpleActor
from mlagents_envs.base_env import ActionTuple, BehaviorSpec, DecisionSteps, TerminalSteps
from steppers import Factory, Stepper

from mlagents_plugin.core.settings import EnvManagerSettings
from mlagents_plugin.local.supervisor import SupervisedEnvManager
from mlagents_plugin.testing import SimpleEnvironment, make_factory

MANAGERS = ("ours", "ours per worker", "upstream", "bare pipe")
TIME_HORIZON = 64  # the AgentManager's trajectory length, as the harness's PPO configuration
WHOLE_RUN_STEPS = 200  # env steps per worker in a whole run

SCENARIOS = [
    Scenario("cheap, 1 agent", dict(num_agents=1), (1, 4, 8)),
    Scenario("cheap, 8 agents", dict(num_agents=8), (8,)),
    Scenario("1 ms CPU + 2 ms sleep, 1 agent", dict(step_cpu_s=0.001, step_sleep_s=0.002), (4,)),
]
QUICK = [Scenario("cheap, 1 agent", dict(num_agents=1), (2,))]


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


# ------------------------------------------------------------------------ the trainer's loop


class TrainerLoop(Stepper):
    """TrainerController's ``advance`` around one env manager, its trainers never updating."""

    def __init__(self, name: str, manager: EnvManager):
        self.name = name
        self.manager = manager
        try:
            self._start()
        except BaseException:
            manager.close()
            raise

    def _start(self) -> None:
        manager = self.manager
        manager.reset({})  # upstream cannot take None
        self.queues: List[AgentManagerQueue] = []
        for behavior, spec in manager.training_behaviors.items():
            policy = TorchPolicy(
                0, spec, NetworkSettings(num_layers=1, hidden_units=32), SimpleActor,
                {"conditional_sigma": False, "tanh_squash": False},
            )
            agents = AgentManager(policy, behavior, StatsReporter(behavior), TIME_HORIZON, threaded=False)
            manager.set_agent_manager(behavior, agents)
            manager.set_policy(behavior, policy)
            self.queues.append(agents.trajectory_queue)

    def step(self) -> Tuple[int, int]:
        steps = self.manager.get_steps()
        self.manager.process_steps(steps)
        for queue in self.queues:  # what a trainer takes, dropped
            while not queue.empty():
                queue.get_nowait()
        agents = sum(len(d) + len(t) for s in steps for d, t in s.current_all_step_result.values())
        return len(steps), agents

    def close(self) -> None:
        self.manager.close()


def _managers(factory: Factory, n_env: int) -> Dict[str, Callable[[], EnvManager]]:
    return {
        "ours": lambda: SupervisedEnvManager(factory, RunOptions(), n_env, EnvManagerSettings()),
        "ours per worker": lambda: SupervisedEnvManager(
            factory, RunOptions(), n_env, EnvManagerSettings(batch_inference=False)
        ),
        "upstream": lambda: SubprocessEnvManager(factory, RunOptions(), n_env),
        "bare pipe": lambda: BarePipeEnvManager(factory, n_env),
    }


def _loops(factory: Factory, n_env: int) -> List[Callable[[], Stepper]]:
    return [lambda m=make, n=name: TrainerLoop(n, m()) for name, make in _managers(factory, n_env).items()]


def whole_run(make: Callable[[], EnvManager], name: str, n_env: int) -> float:
    """Seconds from construction to the end of close, ``WHOLE_RUN_STEPS`` env steps per worker."""
    start = time.perf_counter()
    loop = TrainerLoop(name, make())
    try:
        stepped = 0
        while stepped < WHOLE_RUN_STEPS * n_env:
            stepped += loop.step()[0]
    finally:
        loop.close()
    return time.perf_counter() - start


def run(quick: bool) -> List[Dict]:
    scenarios = QUICK if quick else SCENARIOS
    rows = side_by_side(scenarios, _loops, (1, 0.3, 0.2) if quick else (3, 2.0, 0.5), _line)
    rounds = 1 if quick else 3
    cases = [(scenario, n_env) for scenario in scenarios for n_env in scenario.workers]
    for row, (scenario, n_env) in zip(rows, cases, strict=True):
        factory = make_factory(SimpleEnvironment, **scenario.env)
        times: Dict[str, List[float]] = {name: [] for name in MANAGERS}
        for _ in range(rounds):  # alternating, as the steady state
            for name, make in _managers(factory, n_env).items():
                times[name].append(whole_run(make, name, n_env))
        for name, seconds in times.items():
            row["results"][name]["whole_run_s"] = statistics.median(seconds)
        print("  whole run: " + "  ".join(f"{n} {statistics.median(s):.2f}s" for n, s in times.items()), flush=True)
    return rows


def _line(row: Dict) -> str:
    parts = [f"{row['scenario']}, {row['workers']} worker(s):"]
    for name, r in row["results"].items():
        parts.append(f"{name} {r['env_steps_per_s']:.0f}/s {r['trainer_cpu_us_per_env_step']:.0f}us")
    return "  ".join(parts)


def markdown(rows: List[Dict]) -> str:
    out = [
        "| Scenario | Workers | env steps/s: ours / ours per worker / upstream / bare pipe | ours / bare pipe "
        "| ours per worker / bare pipe | ours / upstream | trainer CPU µs per env step: ours / per worker / "
        "upstream / bare | whole run s: ours / per worker / upstream / bare |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        r = [row["results"][name] for name in MANAGERS]
        ours, per_worker, up, bare = (x["env_steps_per_s"] for x in r)
        out.append(
            f"| {row['scenario']} | {row['workers']} | {ours:.0f} / {per_worker:.0f} / {up:.0f} / {bare:.0f} "
            f"| {ours / bare:.2f} | {per_worker / bare:.2f} | {ours / up:.2f} "
            f"| {' / '.join(format(x['trainer_cpu_us_per_env_step'], '.0f') for x in r)} "
            f"| {' / '.join(format(x['whole_run_s'], '.2f') for x in r)} |"
        )
    return "\n".join(out)
