"""The errors the env manager raises, and how a worker's exception is raised again in the trainer.

WorkerDiedError and WorkerTimeoutError derive from ML-Agents' UnityCommunicationException: for
ML-Agents' TrainerController a lost worker is a lost environment, so it saves the model, logs
"Learning was interrupted" and exits non-zero, exactly as for a crashed Unity build.
"""
import pickle
import signal
import sys
from typing import Optional

from mlagents_envs.exception import UnityCommunicationException, UnityEnvironmentException

from mlagents_plugin.core.protocol import ExceptionEnvelope, StopReport

# NOTE [ Exception notes on Python 3.10 ]
# The manager says which worker failed, doing what, and why it was not restarted, in exception
# notes (PEP 678): the interpreter prints them under the exception, and so do logging and pytest.
# Python 3.10, ML-Agents' own, has neither ``add_note`` nor the printing. There ``add_note``
# below sets ``__notes__`` as 3.11 would, and importing ``exceptiongroup`` (the PEP 654/678
# backport that pytest and anyio load on 3.10, and a requirement of ours there) makes the
# traceback module print them: the user sees the same text on both versions.
if sys.version_info < (3, 11):
    import exceptiongroup  # noqa: F401  (its import teaches traceback to print __notes__)


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``, on Python 3.10 too (NOTE [ Exception notes on Python 3.10 ])."""
    if sys.version_info >= (3, 11):
        exc.add_note(note)
    else:
        exc.__notes__ = [*getattr(exc, "__notes__", ()), note]  # type: ignore[attr-defined]


class EnvWorkerError(UnityCommunicationException):
    """An env worker was lost: it died, or stopped answering."""

    def __init__(self, message: str, worker_id: int, pid: Optional[int]):
        super().__init__(message)
        self.worker_id = worker_id
        self.pid = pid

    def __reduce__(self):
        return type(self), (str(self), self.worker_id, self.pid)


class WorkerDiedError(EnvWorkerError):
    """A worker process exited without telling the trainer why (signal, os._exit, crash)."""

    def __init__(
        self,
        message: str,
        worker_id: int,
        pid: Optional[int],
        exitcode: Optional[int] = None,
    ):
        super().__init__(message, worker_id, pid)
        self.exitcode = exitcode

    def __reduce__(self):
        return type(self), (str(self), self.worker_id, self.pid, self.exitcode)


class ForkServerDiedError(WorkerDiedError):
    """The fork server a worker was forked from died, and the worker with it: not the worker's
    fault, so its restart is not counted, unless the server died too often (``counted``: NOTE
    [ A fork server dies ] in local/fork_server.py)."""

    def __init__(self, message: str, worker_id: int, pid: Optional[int], counted: bool = False):
        super().__init__(message, worker_id, pid)
        self.counted = counted

    def __reduce__(self):
        return type(self), (str(self), self.worker_id, self.pid, self.counted)


class WorkerTimeoutError(EnvWorkerError):
    """A worker did not answer within its deadline."""


class ProtocolError(RuntimeError):
    """A worker got a request it cannot serve (a bug on the trainer's side, or a trainer and a
    worker of different versions): it answers with this at once instead of dropping it."""


class ManagerClosedError(RuntimeError):
    """The env manager was used after ``close()``."""


class AllWorkersFailedError(RuntimeError):
    """Every env worker failed for good; the manager cannot step any more."""


class BuildNotFoundError(UnityEnvironmentException):
    """``--env`` names no Unity build. Not restarted: starting again cannot make one appear."""


class ListenAddressError(UnityEnvironmentException):
    """``env_manager.listen`` names an address the worker's machine cannot listen on. Not
    restarted: starting again cannot give the machine that address."""


class RemoteWorkerError(Exception):
    """A worker raised an exception that could not be rebuilt in the trainer.

    It carries what could be saved: the original type's name, its message and the worker's
    traceback (also attached as ``__cause__``).
    """

    def __init__(self, message: str, type_name: str, remote_traceback: str):
        super().__init__(message)
        self.type_name = type_name
        self.remote_traceback = remote_traceback

    def __reduce__(self):
        return type(self), (str(self), self.type_name, self.remote_traceback)


class RemoteTraceback(Exception):
    """The worker's formatted traceback, attached as ``__cause__`` (as concurrent.futures does)."""

    def __init__(self, tb: str):
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb


def exception_from_envelope(envelope: ExceptionEnvelope, where: str) -> BaseException:
    """Rebuild a worker's exception: the same type when possible, else RemoteWorkerError.

    ``where`` names the worker ("env worker 2 (pid 1234)"); it goes into a note on the
    exception, shown with its traceback (PEP 678), and into the attached remote traceback.
    """
    exc: Optional[BaseException] = None
    if envelope.pickled is not None:
        try:
            exc = pickle.loads(envelope.pickled)
        except Exception:
            exc = None
    doing = f" during {envelope.command.name}" if envelope.command else " while building its env"
    if exc is None:
        exc = RemoteWorkerError(
            f"{where} raised {envelope.type_name}{doing}: {envelope.message} "
            "(the exception could not be sent to the trainer as itself, so it is reported "
            "by name; the worker's traceback is attached as __cause__)",
            envelope.type_name,
            envelope.traceback,
        )
    else:
        add_note(exc, f"Raised in {where}{doing}; its traceback is shown above.")
    exc.__cause__ = RemoteTraceback(f'\n"""\n{where}:\n{envelope.traceback}"""')
    return exc



def error_from_stop(report: StopReport, where: str, worker_id: int, pid: Optional[int]) -> WorkerDiedError:
    """A worker that stopped on a signal or a BaseException: a death, with the worker's traceback
    attached (NOTE [ Exceptions cross as themselves; the rest is a worker failure ])."""
    if report.command:
        doing = f"during {report.command.name}"
    else:
        doing = "between requests" if report.env_built else "while building its env"
    if report.signal is not None:
        name = signal.Signals(report.signal).name
        why = (
            f"was stopped by {name} {doing}: another process asked it to stop (`kill`, "
            "earlyoom, a container runtime?)"
        )
    else:
        raised = report.type_name + (f": {report.message}" if report.message else "")
        exits = " (sys.exit)" if report.type_name == "SystemExit" else ""
        why = f"stopped {doing}: its env raised {raised}{exits}, which ends a process"
    error = WorkerDiedError(f"{where} {why}.", worker_id, pid)
    error.__cause__ = RemoteTraceback(f'\n"""\n{where}:\n{report.traceback}"""')
    return error
