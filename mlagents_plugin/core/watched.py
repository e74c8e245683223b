"""The clock of the manager's deadlines: time in which the trainer was watching.

# NOTE [ Time nobody watched ]
# A deadline (step_timeout_s, startup_timeout_s) says a worker is hung when it stays silent for
# that long *while it could have answered and the trainer could have noticed*. Wall time is not
# that when the trainer itself did not run: Ctrl-Z stops the whole process group (trainer,
# workers and players together) and `fg` resumes it; a laptop suspends, a VM is paused or
# migrated, a container is frozen, or the trainer is starved of CPU. Measured by the wall clock,
# every worker would then be declared hung at once and restarted against its quota, though none
# was. Upstream restarts nothing there (it has no deadlines at all).
#
# So deadlines run on a *watched* clock: the monotonic clock minus every gap in which the
# trainer's own loop did not run. The manager reports the two places where it could lose time:
# - inside its wait: a wait bounded by T seconds that returns after E > T + TOLERANCE_S lost
#   E - T (the process was stopped or suspended while it slept);
# - between two waits, while the trainer does its own work (the policy update, writing
#   summaries): the wall time that the trainer's main thread did not spend on CPU, when more
#   than TOLERANCE_S, is time it was stopped, suspended or starved (blocked on a slow disk or a
#   GPU, too: such a gap only makes a hang take longer to declare). The main thread's CPU time,
#   not the process's: torch's other threads would otherwise hide a stop during an update.
#   The gap is counted as soon as anything reads the clock (a request sent before the next wait
#   gets a deadline that already leaves it out).
# A worker stopped on its own (SIGSTOP to it alone, the chaos run's case) is still caught: the
# trainer keeps waiting in bounded slices that each return on time, so its silence is watched.
# A gap only ever delays a deadline; a worker that is really hung is declared so once the
# trainer has watched it for the whole timeout. Neither CLOCK_BOOTTIME (it sees a suspend but
# not Ctrl-Z) nor the workers' own state (they are stopped too, and resume with the trainer)
# tells the two apart; the trainer's own loop does.
"""
import time
from typing import Callable, Optional, Tuple

# Gaps shorter than this are the scheduler's ordinary noise, not a stop.
TOLERANCE_S = 0.5


class WatchedClock:
    """``now()``: the wall clock (``clock``) without the gaps nobody watched."""

    def __init__(self, clock: Callable[[], float], cpu_clock: Callable[[], float] = time.thread_time):
        self._clock = clock
        self._cpu_clock = cpu_clock
        self.unwatched_s = 0.0  # the sum of every gap so far
        self._left: Optional[Tuple[float, float]] = None  # (wall, CPU) when the loop last left

    def now(self) -> float:
        self._catch_up()
        return self._clock() - self.unwatched_s

    def entered(self) -> None:
        """The manager's loop runs again."""
        self._catch_up()
        self._left = None

    def _catch_up(self) -> None:
        """Count the time since the loop left that the main thread spent neither on CPU nor in
        the loop (once: the count starts again from now)."""
        if self._left is not None:
            wall, cpu = self._left
            now_wall, now_cpu = self._clock(), self._cpu_clock()
            self._lost((now_wall - wall) - (now_cpu - cpu))
            self._left = (now_wall, now_cpu)

    def waited(self, bound_s: float, started: float) -> None:
        """A wait bounded by ``bound_s``, started at wall time ``started``, has returned."""
        self._lost(self._clock() - started - bound_s)

    def left(self) -> None:
        """The manager's loop returns to the trainer."""
        self._left = (self._clock(), self._cpu_clock())

    def _lost(self, gap_s: float) -> None:
        if gap_s > TOLERANCE_S:
            self.unwatched_s += gap_s
