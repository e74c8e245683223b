"""When the trainer waits for workers still stepping, so that one forward pass serves them too.

# NOTE [ Gathering a batch ]
# Batched inference (NOTE [ Batched inference ] in batching.py) serves the workers whose steps
# are in when the trainer asks. Where the trainer is the bottleneck, its workers drift into
# groups that answer apart (with 4 cheap workers on 2 cores: two pairs), and every group costs a
# whole forward pass, whose cost hardly depends on its batch (about 550 µs for ML-Agents' PPO
# actor, 1 to 8 agents). So once the first replies of a ``get_steps`` are in, the manager also
# waits for the workers still stepping whose replies are due within one pass's time: waiting
# that long costs at most the pass it saves, and a worker that is due later is not waited for.
# Each worker reports how long it spent on its request (read to reply, ``StepPayload.step_s``);
# its reply is due at the time its request was sent plus that time's running average (a worker
# overdue by more than a pass is not about to answer: it is not waited for). The pass's time is
# the running average of the trainer's own action computations. Before either is known,
# nothing is waited for. Where the envs are the bottleneck, a worker that answers first waits at
# most one pass's time, and only for workers due within it.
#
# Gathering pays off with NOTE [ Actions as steps land ] (stepper.py): the gathered workers are
# sent their actions together and step while the trainer processes their steps, and they are
# back together for the next ``get_steps``. Without it they would wait for that processing, and
# the trainer, in turn, for their steps.
"""
from typing import Iterable, List, Optional, Tuple

# The weight of the newest measurement in a running average: steps and passes vary from one to
# the next (a terminal step, a batch of 1 or 4), and the average follows a change in a few steps.
NEWEST = 0.2


def _average(average: Optional[float], newest: float) -> float:
    return newest if average is None else average + NEWEST * (newest - average)


class Gathering:
    """Running averages of the workers' step times and the trainer's pass time, and the time
    until which to wait for workers still stepping. The manager is its one writer."""

    def __init__(self, n_env: int):
        self._step_s: List[Optional[float]] = [None] * n_env
        self._pass_s: Optional[float] = None

    def stepped(self, worker_id: int, step_s: float) -> None:
        """Worker ``worker_id`` spent ``step_s`` on a request (its own measure)."""
        self._step_s[worker_id] = _average(self._step_s[worker_id], step_s)

    def passed(self, seconds: float) -> None:
        """The trainer spent ``seconds`` computing one round's actions."""
        self._pass_s = _average(self._pass_s, seconds)

    def wait_until(self, stepping: Iterable[Tuple[int, float]], now: float) -> Tuple[float, List[int]]:
        """For workers still stepping, as (worker id, when its request was sent): until when to
        wait, and for which of them (none: do not wait)."""
        if self._pass_s is None:
            return now, []
        until = now + self._pass_s
        due = []
        for worker_id, sent_at in stepping:
            step_s = self._step_s[worker_id]
            # overdue by more than a pass: slower than it was (or hung), not about to answer
            if step_s is not None and now - self._pass_s <= sent_at + step_s <= until:
                due.append(worker_id)
        return until, due
