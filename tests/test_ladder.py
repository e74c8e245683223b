"""The shutdown ladder's escalation on a fake clock, in the fast tier (NOTE [ Shutdown ladder ]):
which signal goes when, and how each process is said to have gone. Processes and the readiness
set are stand-ins; the real ladder runs in test_shutdown.py and test_supervisor.py."""
from typing import Any, List, Optional, Tuple

import pytest
from fake_backend import FakeClock

from mlagents_plugin.core.lifecycle import Reason
from mlagents_plugin.core.protocol import EnvironmentCommand
from mlagents_plugin.local.shutdown import KILL_WAIT_S, Ladder

pytestmark = pytest.mark.fast

SHUTDOWN_S, GRACE_S = 10.0, 2.0
NO_SUCH_PID = 2**22 + 12345  # above Linux's pid_max: psutil finds no children, no tags


class FakeProcess:
    """A worker that exits on the ``exits_on`` signal ("close", "term", "kill"), at once."""

    def __init__(self, clock: FakeClock, exits_on: str):
        self.clock, self.exits_on = clock, exits_on
        self.pid = NO_SUCH_PID
        self.sentinel = object()
        self.exitcode: Optional[int] = 0 if exits_on == "close" else None
        self.signals: List[Tuple[str, float]] = []  # (signal, when)

    def is_alive(self) -> bool:
        return self.exitcode is None

    def terminate(self) -> None:
        self.signals.append(("SIGTERM", self.clock.now))
        if self.exits_on == "term":
            self.exitcode = -15

    def kill(self) -> None:
        self.signals.append(("SIGKILL", self.clock.now))
        self.exitcode = -9

    def join(self, timeout: Optional[float] = None) -> None:
        pass

    def close(self) -> None:
        pass


class FakeReadiness:
    """Nothing ever becomes ready: a wait lets the fake clock run to its end."""

    def __init__(self, clock: FakeClock):
        self.clock = clock

    def watch(self, handle: Any, data: Any) -> None:
        pass

    def forget(self, handle: Any) -> None:
        pass

    def wait(self, timeout: float) -> list:
        self.clock.now += max(0.0, timeout)
        return []


def ladder_with(exits_on: str, reason: Reason = Reason.CLOSE):
    clock = FakeClock()
    ladder = Ladder(SHUTDOWN_S, GRACE_S, FakeReadiness(clock), clock)  # type: ignore[arg-type]
    process = FakeProcess(clock, exits_on)
    ladder.add("w0", process, None, "env worker 0", "tag/", EnvironmentCommand.STEP, reason)  # type: ignore[arg-type]
    return ladder, process, clock


@pytest.mark.parametrize("exits_on, signals, outcome", [
    ("close", [], "exited"),
    ("term", [("SIGTERM", SHUTDOWN_S)], "exited on SIGTERM"),
    ("kill", [("SIGTERM", SHUTDOWN_S), ("SIGKILL", SHUTDOWN_S + GRACE_S)], "was killed with SIGKILL"),
])
def test_a_closed_worker_climbs_the_ladder_only_as_far_as_it_must(exits_on, signals, outcome):
    ladder, process, clock = ladder_with(exits_on)
    started = clock.now
    ladder.run()
    assert [(name, when - started) for name, when in process.signals] == signals
    assert ladder.outcomes["w0"] == outcome and ladder.departures == []


def test_a_hung_worker_starts_at_sigterm():
    ladder, process, clock = ladder_with("kill", Reason.HUNG)
    started = clock.now
    ladder.run()
    assert [(name, when - started) for name, when in process.signals] == [("SIGTERM", 0.0), ("SIGKILL", GRACE_S)]


def test_a_first_interrupt_hurries_with_sigterm_within_the_deadline_it_had():
    ladder, process, clock = ladder_with("kill")
    started = clock.now
    clock.now += 1.0
    ladder.hurry()
    ladder.run()
    assert [(name, when - started) for name, when in process.signals] == [("SIGTERM", 1.0), ("SIGKILL", SHUTDOWN_S)]


def test_a_second_interrupt_kills_at_once():
    ladder, process, clock = ladder_with("kill")
    started = clock.now
    ladder.force()
    assert [(name, when - started) for name, when in process.signals] == [("SIGKILL", 0.0)]
    assert ladder.outcomes["w0"] == "was killed with SIGKILL" and clock.now - started <= KILL_WAIT_S
