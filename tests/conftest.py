"""Shared test plumbing: every test must leave no process, and no shared memory, behind."""
import os
import time
from typing import List

import psutil
import pytest

from mlagents_plugin import processes, wire

# multiprocessing's own long-lived helpers, started once per test process and shared by tests.
_MP_HELPERS = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")


def leftover_processes() -> List[psutil.Process]:
    """This process's descendants, minus multiprocessing's helpers, plus any orphan we tagged."""
    me = psutil.Process()
    found = {}
    for child in me.children(recursive=True):
        try:
            if child.ppid() == me.pid and any(h in " ".join(child.cmdline()) for h in _MP_HELPERS):
                continue
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.Error:
            continue
        found[child.pid] = child
    for orphan in processes.find_tagged(f"mlagents-plugin/{os.getpid()}-"):
        found[orphan.pid] = orphan
    return list(found.values())


def leftover_segments() -> List[str]:
    """Shared memory segments of managers this process created (wire.py)."""
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"{wire.SEGMENT_PREFIX}{os.getpid()}_")]


def new_leftovers(before: set, grace_s: float = 2.0) -> List[psutil.Process]:
    """Processes that appeared since `before` and are still alive after `grace_s`.

    The grace covers processes already killed but still exiting: mlagents-envs' own close
    SIGKILLs a build that does not quit and does not wait for it."""
    deadline = time.monotonic() + grace_s
    while True:
        left = [p for p in leftover_processes() if p.pid not in before]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


@pytest.fixture(autouse=True)
def no_leftovers():
    before = {p.pid for p in leftover_processes()}
    segments_before = set(leftover_segments())
    yield
    left = new_leftovers(before)
    described = []
    for proc in left:  # do not let one test's leak fail the next ones too
        try:
            described.append(f"pid {proc.pid}: {' '.join(proc.cmdline())[:120]}")
            proc.kill()
        except psutil.Error:
            pass
    segments = sorted(set(leftover_segments()) - segments_before)
    for name in segments:
        os.unlink(os.path.join("/dev/shm", name))
    assert not described, f"processes left behind: {described}"
    assert not segments, f"shared memory left behind: {segments}"
