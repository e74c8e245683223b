"""The restart decision as a value (core/restart.py's ``RestartPolicy.decide``): restart after a
delay, move the port, or fail with a note, for each kind of failure. How the manager carries a
decision out, on a fake backend: test_lifecycle.py; with real processes: test_contract.py."""
from typing import Optional

import pytest
from mlagents.trainers.settings import RunOptions
from mlagents_envs.exception import UnityCommunicationException, UnityWorkerInUseException

from mlagents_plugin.core.errors import BuildNotFoundError, ForkServerDiedError, RemoteWorkerError, WorkerDiedError
from mlagents_plugin.core.protocol import qualified_name
from mlagents_plugin.core.restart import MAX_PORT_MOVES, Cause, Fail, MovePort, Restart, RestartPolicy

pytestmark = pytest.mark.fast


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def policy(lifetime=10, rate_n=-1, period_s=60.0, backoff_s=1.0, editor=False, n_env=2, **kwargs):
    run_options = RunOptions()
    env = run_options.env_settings
    env.max_lifetime_restarts, env.restarts_rate_limit_n, env.restarts_rate_limit_period_s = lifetime, rate_n, period_s
    clock = Clock()
    made = RestartPolicy(env, backoff_s=backoff_s, clock=clock, waits_for_the_editor=editor, n_env=n_env, **kwargs)
    return made, clock


def nobody(port: int) -> Optional[str]:
    return None


def decide(made: RestartPolicy, exc: BaseException, worker_id=0, env_worker_id=0, ever_started=True):
    return made.decide(worker_id, exc, env_worker_id=env_worker_id, ever_started=ever_started, port_holder=nobody)


def died(worker_id=0) -> WorkerDiedError:
    return WorkerDiedError("env worker died", worker_id, 123)


def test_a_death_restarts_at_once_then_backs_off_within_the_rate_period():
    made, clock = policy(backoff_s=1.0, period_s=60.0)
    assert [decide(made, died()) for _ in range(3)] == [
        Restart(0.0, Cause.DIED), Restart(1.0, Cause.DIED), Restart(2.0, Cause.DIED)
    ]
    assert decide(made, died(1), worker_id=1) == Restart(0.0, Cause.DIED)  # counted per worker
    clock.now += 61.0  # the period passed: at once again
    assert decide(made, died()) == Restart(0.0, Cause.DIED)


def test_no_quota_left_fails_with_the_history():
    made, _ = policy(lifetime=1)
    assert decide(made, UnityCommunicationException("lost")) == Restart(0.0, Cause.UNITY)
    decision = decide(made, UnityCommunicationException("lost again"))
    assert isinstance(decision, Fail) and decision.cause is Cause.UNITY
    (note,) = decision.notes
    assert "max_lifetime_restarts=1" in note and "its 1 restart(s)" in note
    assert "after UnityCommunicationException: lost" in note


def test_a_worker_that_never_started_is_retried_once():
    made, _ = policy()
    assert decide(made, died(), ever_started=False) == Restart(0.0, Cause.DIED)
    decision = decide(made, died(), ever_started=False)
    assert isinstance(decision, Fail) and "never once finished building its env" in decision.notes[0]


def test_what_starting_again_cannot_heal_fails_without_a_note():
    made, _ = policy()
    assert decide(made, BuildNotFoundError("no build at ./Build")) == Fail(Cause.OTHER, ())
    assert decide(made, KeyError("x")) == Fail(Cause.OTHER, ())
    assert made.history == {}


def test_listed_exceptions_restart_by_name_even_rebuilt_remotely():
    made, _ = policy(restart_on=("KeyError",))
    assert decide(made, KeyError("x")) == Restart(0.0, Cause.LISTED)
    remote = RemoteWorkerError("x", "builtins.KeyError", "traceback")
    assert decide(made, remote, worker_id=1) == Restart(0.0, Cause.LISTED)


def test_a_worker_lost_with_its_fork_server_restarts_at_once_uncounted():
    made, _ = policy(lifetime=0)
    for _ in range(3):
        assert decide(made, ForkServerDiedError("server died", 0, 123)) == Restart(0.0, Cause.FORK_SERVER)
    assert made.history == {}
    counted = decide(made, ForkServerDiedError("server died too often", 0, 123, counted=True))
    assert isinstance(counted, Fail) and counted.cause is Cause.DIED


@pytest.mark.parametrize("exc", [
    UnityWorkerInUseException(0),
    RemoteWorkerError("garbled", qualified_name(UnityWorkerInUseException), "traceback"),
], ids=["rebuilt", "by-name"])
def test_a_taken_port_moves_to_ids_nobody_uses_then_fails(exc):
    made, _ = policy(lifetime=0, n_env=3)
    env_worker_id, moves = 1, []
    for _ in range(MAX_PORT_MOVES):
        decision = decide(made, exc, worker_id=1, env_worker_id=env_worker_id)
        assert isinstance(decision, MovePort)
        moves.append(decision.env_worker_id)
        env_worker_id = decision.env_worker_id
    assert moves == list(range(3, 3 + MAX_PORT_MOVES))
    assert decide(made, exc, worker_id=1, env_worker_id=env_worker_id) == Fail(Cause.OTHER, ())
    assert made.history == {}  # a move is not a restart


def test_a_move_says_which_port_and_who_holds_it():
    made, _ = policy(n_env=2)
    base = made.base_port
    decision = made.decide(
        0, UnityWorkerInUseException(0), env_worker_id=0, ever_started=True,
        port_holder=lambda port: f"pid 42 (Unity) on {port}",
    )
    assert decision == MovePort(
        2, f"Env worker 0: port {base} (worker id 0) is held by pid 42 (Unity) on {base}; "
        f"moving to worker id 2 (port {base + 2})."
    )


def test_the_editors_port_is_never_moved_and_the_note_names_its_holder():
    made, _ = policy(editor=True)
    decision = made.decide(
        0, UnityWorkerInUseException(0), env_worker_id=0, ever_started=True, port_holder=lambda port: "pid 7 (python)"
    )
    assert isinstance(decision, Fail) and decision.cause is Cause.OTHER
    (note,) = decision.notes
    assert "waits for the Unity Editor on port 5004, which pid 7 (python) holds" in note
