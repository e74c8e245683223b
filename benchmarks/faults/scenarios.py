"""The fault scenarios: what each does to the manager under test, and which facts it notes."""
import os
import signal
import time
import traceback
from typing import Any, Callable, NamedTuple

from faults import N_ENV
from faults.processes import player_pids
from faults.record import describe_exception, first_line
from faults.trainer import Run

FAULTY_FILE = "faulty_envs.py"  # a worker traceback shows a frame from this file


class CustomEnvError(Exception):
    """The "custom exception" of scenario 5. Defined in a module (not ``__main__``), so that
    workers can unpickle it by reference."""


def testing():
    """``mlagents_plugin.testing``, imported only by the runs: the parent never loads ML-Agents."""
    import mlagents_plugin.testing as testing_module

    return testing_module


def scenario_kill(run: Run) -> None:
    t = testing()
    manager = run.manager(t.make_factory(t.SimpleEnvironment, step_sleep_s=0.01))
    run.loop(manager, 1.0, "warm-up")
    victim = run.worker_pids(manager)[1]
    killed_at = time.time()
    os.kill(victim, signal.SIGKILL)
    run.fact(f"SIGKILLed worker 1 (pid {victim})")
    run.loop(manager, 15.0).describe(killed_at, 1, "after the kill")
    run.close(manager)


def scenario_exit(run: Run) -> None:
    t = testing()
    factory = t.make_factory(
        t.HardExitEnvironment, exit_code=3, after_steps=5, only_worker=1, step_sleep_s=0.01
    )
    manager = run.manager(factory)
    start = time.time()
    run.loop(manager, 15.0).describe(start, 1, "into the loop")
    run.close(manager)


def scenario_hang(run: Run) -> None:
    t = testing()
    factory = t.make_factory(t.HangingEnvironment, after_steps=5, only_worker=1, step_sleep_s=0.01)
    manager = run.manager(factory, step_timeout_s=2.0)
    start = time.time()
    run.loop(manager, 20.0).describe(start, 1, "into the loop")
    run.close(manager)


def scenario_cpu(run: Run) -> None:
    t = testing()
    manager = run.manager(t.make_factory(t.SimpleEnvironment, step_sleep_s=0.05))
    run.loop(manager, 0.5, "warm-up")
    loop = run.loop(manager, 5.0)
    steps = sum(len(ts) for ts in loop.steps.values())
    run.fact(
        f"{steps} steps in {loop.wall:.1f} s ({steps / loop.wall:.0f}/s; ideal {N_ENV / 0.05:.0f}/s); "
        f"**trainer CPU {loop.cpu:.2f} s / {loop.wall:.1f} s wall = {loop.cpu / loop.wall:.0%} of a core**"
    )
    if loop.error is not None:
        run.fact(f"get_steps raised {describe_exception(loop.error)}")
    run.close(manager)


def where_is_worker_traceback(exc: BaseException) -> str:
    """Where, if anywhere, the caller can find the worker's traceback (a faulty_envs.py frame)."""
    places = []
    if any(FAULTY_FILE in frame.filename for frame in traceback.extract_tb(exc.__traceback__)):
        places.append("exc.__traceback__")
    if exc.__cause__ is not None and FAULTY_FILE in "".join(traceback.format_exception(exc.__cause__)):
        places.append(f"exc.__cause__ ({type(exc.__cause__).__name__})")
    if exc.__context__ is not None and exc.__context__ is not exc.__cause__:
        if FAULTY_FILE in "".join(traceback.format_exception(exc.__context__)):
            places.append(f"exc.__context__ ({type(exc.__context__).__name__})")
    if FAULTY_FILE in str(exc):
        places.append("str(exc)")
    places += [f"exc.{name}" for name, value in vars(exc).items() if FAULTY_FILE in str(value)]
    notes = getattr(exc, "__notes__", None)
    where = "worker traceback available in " + " and ".join(places) if places else (
        "**no worker traceback** reaches the caller"
    )
    return where + (f"; note: {first_line(notes[0])}" if notes else "")


def raising_scenario(env_class_name: str, **env_kwargs: Any) -> Callable[[Run], None]:
    """A scenario in which worker 1's env raises at step 5: ``env_class_name`` from
    ``mlagents_plugin.testing``, built with ``env_kwargs``."""

    def scenario(run: Run) -> None:
        t = testing()
        factory = t.make_factory(
            getattr(t, env_class_name), after_steps=5, only_worker=1, step_sleep_s=0.01, **env_kwargs
        )
        manager = run.manager(factory)
        run.record.data["grep_console"] = FAULTY_FILE
        start = time.time()
        loop = run.loop(manager, 10.0)
        loop.describe(start, 1, "into the loop")
        if loop.error is not None:
            run.fact(where_is_worker_traceback(loop.error))
        run.close(manager)

    return scenario


def scenario_close_hung(run: Run) -> None:
    t = testing()
    factory = t.make_factory(
        t.HangingEnvironment, after_steps=1, only_worker=1, ignore_sigterm=True, step_sleep_s=0.01
    )
    manager = run.manager(factory)
    start = time.time()
    run.loop(manager, 2.0).describe(start, 1, "into the loop")
    run.close(manager)


def scenario_player(run: Run) -> None:
    t = testing()
    os.makedirs(run.player_dir, exist_ok=True)
    factory = t.make_factory(
        t.PlayerLaunchingEnvironment, player_pid_dir=run.player_dir, step_sleep_s=0.01
    )
    manager = run.manager(factory)
    run.loop(manager, 1.0, "warm-up")
    victim = run.worker_pids(manager)[1]
    killed_at = time.time()
    os.kill(victim, signal.SIGKILL)
    run.fact(f"SIGKILLed worker 1 (pid {victim}); players started so far: {len(player_pids(run.run_dir))}")
    run.loop(manager, 4.0).describe(killed_at, 1, "after the kill")
    run.fact(f"players started in all: {len(player_pids(run.run_dir))}")
    run.close(manager)


class Scenario(NamedTuple):
    key: str
    title: str
    body: Callable[[Run], None]
    bound_s: float  # the run is killed if the scenario has not returned by then


SCENARIOS = [
    Scenario("kill", "1. worker SIGKILLed mid-run (loop 15 s)", scenario_kill, 50),
    Scenario("exit", "2. worker calls `os._exit(3)` at step 5 (HardExitEnvironment)", scenario_exit, 45),
    Scenario(
        "hang",
        "3. worker hangs in step 5 (HangingEnvironment; loop 20 s; ours step_timeout_s=2)",
        scenario_hang,
        55,
    ),
    Scenario("cpu", "4. trainer CPU while workers sleep 50 ms per step (5 s)", scenario_cpu, 40),
    Scenario(
        "exception",
        "5. env raises a custom exception (`CustomEnvError`) in step 5",
        raising_scenario("UnexpectedExceptionEnvironment", exception_type=CustomEnvError, message="injected fault"),
        40,
    ),
    Scenario(
        "unpicklable",
        "6a. env raises an exception that cannot be pickled (holds a lock)",
        raising_scenario("UnpicklableExceptionEnvironment", kind="lock", message="injected fault"),
        40,
    ),
    Scenario(
        "unrebuildable",
        "6b. env raises an exception that cannot be rebuilt (`__init__(code, detail)`)",
        raising_scenario("UnpicklableExceptionEnvironment", kind="two_args", message="injected fault"),
        40,
    ),
    Scenario(
        "close_hung",
        "7. close() with a hung worker that ignores SIGTERM (then the interpreter must exit)",
        scenario_close_hung,
        45,
    ),
    Scenario(
        "player",
        "8. worker that launched a player is SIGKILLed, then close()",
        scenario_player,
        45,
    ),
]
BY_KEY = {s.key: s for s in SCENARIOS}
