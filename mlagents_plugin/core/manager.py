"""ML-Agents' EnvManager over supervised worker slots, for every backend: the wiring.

Three rooms do the work: the Supervisor (supervision.py) keeps the slots over a backend, their
deadlines, failures, restarts and close; the Stepper (stepper.py) computes actions and collects
steps; a backend (backend.py) only starts, reaches, waits for and takes down workers. This class
is ML-Agents' EnvManager interface over them: it routes what each pump brought (steps to the
stepper, a failed worker's trajectories dropped, the first failure raised), and closes whatever
is still open at interpreter exit.
"""
import atexit
import multiprocessing.util  # noqa: F401  registers its exit handler before ours: NOTE [ Interpreter exit ]
import time
from typing import Callable, Dict, List, Optional, Set

from mlagents.trainers.env_manager import EnvironmentStep, EnvManager
from mlagents.trainers.settings import RunOptions, TrainerSettings
from mlagents_envs import logging_util
from mlagents_envs.base_env import BaseEnv, BehaviorName, BehaviorSpec
from mlagents_envs.side_channel.side_channel import SideChannel

from mlagents_plugin.core import factories, signals, worker_inputs
from mlagents_plugin.core.backend import Backend, BackendSetup
from mlagents_plugin.core.lifecycle import Slot, WorkerState, WorkerView
from mlagents_plugin.core.placement import Placement
from mlagents_plugin.core.protocol import EnvironmentCommand, WorkerSpec
from mlagents_plugin.core.restart import RestartPolicy
from mlagents_plugin.core.settings import EnvManagerSettings
from mlagents_plugin.core.stepper import Stepper
from mlagents_plugin.core.supervision import MAX_WAIT_S, Pumped, Supervisor
from mlagents_plugin.integration import compat

logger = logging_util.get_logger(__name__)

EnvFactory = Callable[[int, List[SideChannel]], BaseEnv]
# Slots a reset does not wait for: failed for good, or a restart whose start raised to the trainer.
GONE = (WorkerState.FAILED, WorkerState.CLOSED)


class SupervisedManagerBase(EnvManager):
    """The manager over a backend; ``SupervisedEnvManager`` and ``RayEnvManager`` choose one."""

    def __init__(
        self,
        env_factory: EnvFactory,
        run_options: RunOptions,
        n_env: int,
        settings: Optional[EnvManagerSettings],
        backend: Callable[[BackendSetup], Backend],
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.thread_time,
    ):
        """``backend`` builds the transport (a Backend subclass); ``clock`` and ``cpu_clock`` (this
        thread's CPU time) are injected by the fast tests. Every worker is started before this
        returns."""
        super().__init__()
        if not callable(env_factory):
            raise TypeError(
                f"env_factory must be callable as (worker_id, side_channels) -> BaseEnv, "
                f"not {env_factory!r}"
            )
        self.run_options = run_options
        self.settings = (settings or EnvManagerSettings()).resolved(run_options)
        other_machines = getattr(backend, "WORKERS_ON_OTHER_MACHINES", False)
        self._pickled_factory = factories.dumps_factory(env_factory, other_machines=other_machines)
        self.env_parameters: Optional[Dict] = None
        self._engine_config = worker_inputs.engine_config(run_options.engine_settings)
        self._analytics = worker_inputs.Analytics(run_options)
        restarts = RestartPolicy(
            run_options.env_settings,
            self.settings.restart_on,
            self.settings.restart_backoff_s,
            clock,
            # mlagents-learn without --env: ML-Agents' factory connects to the Editor's fixed port
            waits_for_the_editor=run_options.env_settings.env_path is None
            and getattr(env_factory, "__module__", None) == "mlagents.trainers.learn",
            n_env=n_env,
        )
        self._interrupts_before = signals.interrupts()  # NOTE [ Trainer signals ]: a lost one is raised again
        self.supervisor = Supervisor(
            self.settings,
            n_env,
            self._worker_spec,
            restarts,
            backend(BackendSetup(self.settings, n_env, self._pickled_factory, clock)),
            type(self).__name__,
            clock,
            cpu_clock,
        )
        self.stepper = Stepper(self.supervisor, self._pump, self.policies, self.settings, n_env, clock)
        _open_managers.add(self)
        try:
            self.supervisor.launch_all()
        except BaseException:
            self.close()
            raise

    # ----------------------------------------------------------------- EnvManager interface

    def _step(self) -> List[EnvironmentStep]:
        signals.raise_if_lost(self._interrupts_before)
        steps = self.stepper.step()
        return self._with_health_stats(steps)

    def _reset_env(self, config: Optional[Dict] = None) -> List[EnvironmentStep]:
        signals.raise_if_lost(self._interrupts_before)
        # Steps in flight belong to the episodes being reset: let them land, then drop them. So
        # do a restarted worker's queued RESET, sent before these parameters (upstream, too,
        # answers what is outstanding first, then sends every worker the parameters and a RESET).
        self._pump_until(lambda: all(w.awaiting is None for w in self.workers))
        self.stepper.drop_completed()
        self.env_parameters = config
        self.supervisor.set_parameters(worker_inputs.parameter_calls(config))
        self.supervisor.reset_all()

        # One step per worker, as upstream. A worker that fails now is restarted (and reset) if
        # the policy allows, and its new incarnation's reset step is the one returned; if it is
        # not restarted, its error is raised from here.
        def every_worker_reset() -> bool:
            reset = self.stepper.completed_workers()
            return all(w.worker_id in reset or w.state in GONE for w in self.workers)

        self._pump_until(every_worker_reset)
        return self.stepper.take_completed()

    def set_env_parameters(self, config: Optional[Dict] = None) -> None:
        self.env_parameters = config
        self.supervisor.set_parameters(worker_inputs.parameter_calls(config))
        self.supervisor.flush()

    def on_training_started(self, behavior_name: str, trainer_settings: TrainerSettings) -> None:
        message = self._analytics.training_started(behavior_name, trainer_settings)
        # as upstream: only worker 0 has the analytics channel
        self.supervisor.send(0, EnvironmentCommand.TRAINING_STARTED, message)
        self.supervisor.flush()

    @property
    def training_behaviors(self) -> Dict[BehaviorName, BehaviorSpec]:
        """Every behaviour any worker reported. Workers send specs with READY and whenever
        new behaviours appear, so this needs no round trip once the workers are up."""
        self._pump_until(self.supervisor.knows_behaviors)
        return self.supervisor.behavior_specs()

    @property
    def workers(self) -> List[WorkerView]:
        """Each worker slot as it is now: its incarnation, state, outstanding request and pid."""
        return self.supervisor.workers

    @property
    def placements(self) -> Dict[int, Placement]:
        """Where each running worker is, by worker id: its pid, and its node and actor on Ray."""
        return self.supervisor.placements

    @property
    def worker_pids(self) -> Dict[int, int]:
        """The pid of each running (or starting) worker, by worker id."""
        return {worker_id: p.pid for worker_id, p in self.placements.items() if p.pid is not None}

    @property
    def restart_counts(self) -> Dict[str, int]:
        """Restarts so far, by cause (``died``, ``hung``, ``unity``, ``restart_on``)."""
        counts: Dict[str, int] = {}
        for health in self.supervisor.health.workers:
            for cause, n in health.restarts.items():
                counts[cause.value] = counts.get(cause.value, 0) + n
        return counts

    def close(self) -> None:
        """Close every worker, bounded: CLOSE, then the backend's ladder. Idempotent; never
        raises: ``mlagents-learn`` writes its run logs (timers, training status) after it.
        Interrupts while closing: ``Supervisor.close``."""
        _open_managers.discard(self)
        self.supervisor.close()

    # ------------------------------------------------------------------------- wiring

    def _pump(self, limit_s: float = MAX_WAIT_S) -> None:
        """One supervisor pump: its steps go to the stepper; a failed worker's steps not yet
        returned and its partial trajectories are dropped; then the first failure that must
        reach the trainer is raised (NOTE [ A wait is handled whole ] in supervision.py)."""
        pumped = Pumped([], [], [])
        try:
            self.supervisor.pump(pumped, limit_s)
        finally:  # also when an interrupt ended it: what it handled is not lost
            with signals.deferred():  # nor half routed
                self.stepper.landed(pumped.landed)  # a released worker's came before its release
                for worker_id in pumped.released:
                    self.stepper.forget(worker_id)
                    compat.drop_worker_trajectories(self.agent_managers, worker_id)
        if pumped.failures:
            raise pumped.failures[0]

    def _pump_until(self, done: Callable[[], bool]) -> None:
        while not done():
            self._pump()

    def _worker_spec(self, slot: Slot) -> WorkerSpec:
        """What the slot's new incarnation starts with."""
        return WorkerSpec(
            worker_id=slot.worker_id,
            incarnation=slot.incarnation,
            env_worker_id=slot.env_worker_id,
            pickled_env_factory=self._pickled_factory,
            env_path=self.run_options.env_settings.env_path,
            engine_config=self._engine_config,
            analytics=self._analytics.environment_initialized if slot.worker_id == 0 else None,
            log_level=logger.getEffectiveLevel(),
            listen=self.settings.listen,
        )

    def _with_health_stats(self, steps: List[EnvironmentStep]) -> List[EnvironmentStep]:
        """Attach due health numbers to the first step (see stats.py)."""
        health = self.supervisor.health.due()
        if not health:
            return steps
        first = steps[0]
        stats = {**first.environment_stats, **health}
        return [first._replace(environment_stats=stats)] + steps[1:]


# NOTE [ Interpreter exit ]
# Worker processes are not daemonic (a daemonic process may not start children, and envs may
# need to), so multiprocessing's own exit handler *joins* them, without a timeout. A trainer that
# never called close() would hang there. This handler is registered after multiprocessing's and
# therefore runs before it: it closes every manager still open, ladder included, so nothing is
# left for multiprocessing to wait for. (Ray registers its own exit handler when it is imported,
# after this one, so it runs first and its actors go with the driver; a RayEnvManager closed
# here then only says so: ray/backend.py.)
_open_managers: Set[SupervisedManagerBase] = set()


@atexit.register
def _close_open_managers() -> None:
    for manager in list(_open_managers):
        manager.close()
