"""The trainer's side of the reaper (NOTE [ The reaper ] in reaper.py): started on first use,
told each worker and directory to take down with this process."""
import json
import os
import subprocess
import sys
import threading
from typing import IO, Optional

from mlagents_envs import logging_util

from mlagents_plugin.core import wire
from mlagents_plugin.local import processes
from mlagents_plugin.local.linux import reaper as reaper_script

assert sys.platform == "linux"

logger = logging_util.get_logger(__name__)


class Reaper:
    """This process's reaper (NOTE [ The reaper ]), started on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stdin: Optional[IO[bytes]] = None
        self._for_pid = 0  # the process it watches: a fork of this one needs its own

    def watch_worker(self, pid: int) -> None:
        """Have the reaper take ``pid`` down, with its tree, if this process is killed."""
        self._tell(f"worker {pid} {reaper_script.starttime(pid) or 0}")

    def remove_with_me(self, directory: str) -> None:
        """Have the reaper remove ``directory`` if this process is killed."""
        self._tell(f"dir {directory}")

    def _tell(self, line: str) -> None:
        with self._lock:
            for _ in range(2):  # a reaper that was killed is replaced, once
                if self._stdin is None or self._for_pid != os.getpid():
                    self._stdin = self._start()
                try:
                    self._stdin.write((line + "\n").encode())
                    self._stdin.flush()
                    return
                except OSError:
                    self._stdin = None
            logger.warning("Could not start a reaper: if this process is killed, its workers' "
                           "players may outlive it until the next run's sweep.")

    def _start(self) -> IO[bytes]:
        me = os.getpid()
        names = reaper_script.Names(
            supervisor=me,
            owner_env=processes.OWNER_ENV,
            owner_root=processes.OWNER_ROOT,
            owner_prefix=processes.owner_prefix(me),
            segment_root=wire.SEGMENT_PREFIX,
            segment_prefix=f"{wire.SEGMENT_PREFIX}{me}_",  # wire.manager_prefix names segments so
            dir_root=processes.DIR_ROOT,
        )
        launcher = subprocess.Popen(
            [sys.executable, "-I", "-S", reaper_script.__file__, json.dumps(names._asdict())],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # out of reach of signals to our process group
        )
        launcher.wait()  # it forks the reaper and exits at once (reaper.py)
        assert launcher.stdin is not None
        self._for_pid = me
        return launcher.stdin


reaper = Reaper()  # this process's (a fork of it starts its own on first use)
