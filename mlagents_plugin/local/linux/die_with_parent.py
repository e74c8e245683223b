"""Exec a program that the kernel kills when the thread that started it ends.

Run as ``python -I -S die_with_parent.py LAUNCHER_PID PROGRAM [ARG...]`` by a worker that
launches a Unity player (NOTE [ Players die with their worker ] in players.py). It sets
PR_SET_PDEATHSIG=SIGKILL, checks that its parent is still LAUNCHER_PID (had the launcher died
before the prctl, the signal would never come), and execs PROGRAM in its own place: same pid,
same session, same environment, file descriptors and signal dispositions as Popen gave it.
Standard library only, so that it costs milliseconds. If prctl fails, PROGRAM runs anyway (the
reaper is the second line).
"""
import ctypes
import errno
import os
import signal
import sys
from typing import List

assert sys.platform == "linux"  # prctl (NOTE [ Portable core, Linux hardening ])

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def main(argv: List[str]) -> int:
    launcher, program = int(argv[0]), argv[1:]
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
        # prctl(int option, unsigned long...) is variadic: each argument as the kernel reads it
        prctl(ctypes.c_int(PR_SET_PDEATHSIG), *(ctypes.c_ulong(n) for n in (signal.SIGKILL, 0, 0, 0)))
    except (OSError, AttributeError):
        pass
    if os.getppid() != launcher:
        return 1  # the launcher is gone: nobody wants the program any more
    for name in ("SIGPIPE", "SIGXFSZ"):  # Python's start-up ignored them: as Popen restores them
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    try:
        os.execv(program[0], program)
    except OSError as e:
        sys.stderr.write(f"mlagents-plugin: cannot run {program[0]!r}: {e}\n")
        return 127 if e.errno == errno.ENOENT else 126  # as a shell says it
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
