"""How a step's results travel from a worker to the trainer.

# NOTE [ Step wire format ]
# Pickling ML-Agents' DecisionSteps and TerminalSteps costs the worker about 90 µs and the
# trainer about 60 µs per step for a one-agent env: a dozen small numpy arrays, each rebuilt
# through its own reduce call. Instead, ``encode`` lays every array of a step end to end in one
# buffer and describes them in a small layout (dtype, shape, offset); ``decode`` rebuilds the
# arrays as views of that one buffer and the DecisionSteps/TerminalSteps around them. The
# buffer travels as a bytearray, so the arrays the trainer gets are writable, as unpickled
# ones would be.
#
# Arrays of at least SHARED_MEMORY_MIN_BYTES (camera observations: 84x84x3 floats for 32 agents
# is 2.7 MB per step) go through a shared memory segment instead of the pipe, which would
# otherwise move them 64 KB at a time, with a context switch each way. One segment per worker
# suffices: the trainer copies the arrays out as soon as the reply arrives, before it sends the
# worker its next request. The copy cannot be avoided: ML-Agents keeps each step's observation
# arrays (views of them) in its trajectories for up to time_horizon steps, and the worker writes
# the next step into the same segment.
#
# On Linux a segment is a file in /dev/shm, a tmpfs, and its pages exist only once written:
# creating it succeeds however full /dev/shm is, and the first write past the end of the space
# kills the worker with SIGBUS (Docker gives a container 64 MB there unless told otherwise, which
# 8 workers of camera observations overflow). So a new segment's pages are allocated at once
# (``posix_fallocate``): a full /dev/shm is then an error the worker can act on. A worker that
# cannot create a segment, or reserve its pages, sends everything through the pipe and says so
# once, with /dev/shm's size and what to do (``--shm-size``). A worker that dies of SIGBUS
# anyway is reported with /dev/shm as the likely cause (local/backend.py).
#
# Segments are named ``<prefix><generation>``, the prefix naming the trainer, the worker and its
# incarnation, so that whoever outlives their creator can find and remove them: the worker when
# it closes; the supervisor when it reaps a worker or closes (``departed_segments``: the last
# one the trainer was told of and the one after it, since a worker makes the next generation
# while it serves a step, after unlinking the one before); and, with the Linux hardening, the
# trainer's reaper when the trainer is killed and any new reaper's sweep, which list /dev/shm
# (NOTE [ No orphans ] in processes.py). On Windows a segment goes with its last handle.
"""
import math
import os
import shutil
import sys
from multiprocessing import shared_memory
from typing import Dict, List, Optional, Tuple

import numpy as np
from mlagents_envs.base_env import DecisionSteps, TerminalSteps

from mlagents_plugin.core.protocol import EncodedSteps

SHARED_MEMORY_MIN_BYTES = 64 * 1024
DEV_SHM = "/dev/shm"  # where Linux keeps POSIX shared memory
SEGMENT_PREFIX = "mlap_"  # + trainer pid, manager token, worker id, incarnation, generation
_ALIGN = 8


def manager_prefix(trainer_pid: int, token: str) -> str:
    """The start of the names of every segment of one env manager."""
    return f"{SEGMENT_PREFIX}{trainer_pid}_{token}_"


def segment_prefix(manager: str, worker_id: int, incarnation: int) -> str:
    """The start of the names of one worker incarnation's segments."""
    return f"{manager}{worker_id}_{incarnation}_"


class Encoder:
    """Worker side: owns the worker's shared memory segment, if any."""

    def __init__(self, prefix: Optional[str]):
        self.prefix = prefix  # None: no shared memory, everything through the pipe
        self.segment: Optional[shared_memory.SharedMemory] = None
        self.generation = 0
        self.shared_memory_failed: Optional[str] = None

    def encode(self, results: Dict[str, Tuple[DecisionSteps, TerminalSteps]]) -> EncodedSteps:
        arrays: List[np.ndarray] = []
        behaviors = []
        for name, (decision, terminal) in results.items():
            mask = decision.action_mask
            arrays += decision.obs
            arrays += [decision.reward, decision.agent_id, decision.group_id, decision.group_reward]
            arrays += mask or []
            arrays += terminal.obs
            arrays += [
                terminal.reward,
                terminal.interrupted,
                terminal.agent_id,
                terminal.group_id,
                terminal.group_reward,
            ]
            behaviors.append((name, len(decision.obs), -1 if mask is None else len(mask), len(terminal.obs)))
        arrays = [np.asarray(a) for a in arrays]  # mlagents-envs gives group ids as a list
        big = [a.nbytes >= SHARED_MEMORY_MIN_BYTES for a in arrays]
        segment = (
            self._segment_for(sum(_padded(a.nbytes) for a, b in zip(arrays, big, strict=True) if b))
            if any(big)
            else None
        )
        parts: List[bytes] = []
        slots = []
        offset = shared_offset = 0
        for array, is_big in zip(arrays, big, strict=True):
            array = np.ascontiguousarray(array)
            size = _padded(array.nbytes)
            if is_big and segment is not None:
                assert segment.buf is not None  # open: close() forgets the segment
                np.frombuffer(segment.buf, array.dtype, array.size, shared_offset)[:] = array.reshape(-1)
                slots.append((array.dtype.str, array.shape, True, shared_offset))
                shared_offset += size
            else:
                parts.append(array.tobytes())
                if size > array.nbytes:
                    parts.append(bytes(size - array.nbytes))
                slots.append((array.dtype.str, array.shape, False, offset))
                offset += size
        segment_name = segment.name if segment is not None else None
        return EncodedSteps(tuple(behaviors), tuple(slots), bytearray(b"".join(parts)), segment_name)

    def _segment_for(self, size: int) -> Optional[shared_memory.SharedMemory]:
        if self.segment is not None and self.segment.size >= size:
            return self.segment
        if self.shared_memory_failed or self.prefix is None:
            return None
        self.close()
        self.generation += 1
        try:  # room to grow a little without a new segment
            segment = shared_memory.SharedMemory(
                name=f"{self.prefix}{self.generation}", create=True, size=size + size // 4
            )
        except OSError as e:
            self.shared_memory_failed = f"creating a shared memory segment failed: {e}"
            return None
        self.segment = segment  # close() removes it if it cannot be used
        self.shared_memory_failed = _reserve(segment)
        if self.shared_memory_failed:
            self.close()
            return None
        return self.segment

    def close(self) -> None:
        if self.segment is not None:
            self.segment.close()
            try:
                self.segment.unlink()
            except FileNotFoundError:
                pass  # the supervisor removed it already
            self.segment = None


class Decoder:
    """Trainer side, one per worker incarnation: maps the worker's segment while it exists."""

    def __init__(self) -> None:
        self.segment: Optional[shared_memory.SharedMemory] = None

    def decode(self, encoded: EncodedSteps) -> Dict[str, Tuple[DecisionSteps, TerminalSteps]]:
        shared = self._segment(encoded.segment)
        arrays = []
        for dtype, shape, in_segment, offset in encoded.slots:
            if in_segment:  # copied out: the worker writes its next step there (NOTE above)
                assert shared is not None and shared.buf is not None  # the reply named the segment
                array = np.frombuffer(shared.buf, dtype, math.prod(shape), offset).copy()
            else:
                array = np.frombuffer(encoded.buffer, dtype, math.prod(shape), offset)
            arrays.append(array if len(shape) == 1 else array.reshape(shape))
        results = {}
        it = iter(arrays)
        for name, decision_obs, mask_branches, terminal_obs in encoded.behaviors:
            obs = [next(it) for _ in range(decision_obs)]
            reward, agent_id, group_id, group_reward = next(it), next(it), next(it), next(it)
            mask = None if mask_branches < 0 else [next(it) for _ in range(mask_branches)]
            decision = DecisionSteps(obs, reward, agent_id, mask, group_id, group_reward)
            obs = [next(it) for _ in range(terminal_obs)]
            terminal = TerminalSteps(obs, next(it), next(it), next(it), next(it), next(it))
            results[name] = (decision, terminal)
        return results

    @property
    def segment_name(self) -> Optional[str]:
        """The worker's segment its last reply named, if any."""
        return self.segment.name if self.segment is not None else None

    def _segment(self, name: Optional[str]) -> Optional[shared_memory.SharedMemory]:
        if name is None:
            return None
        if self.segment is None or self.segment.name != name:
            self.close()
            self.segment = shared_memory.SharedMemory(name=name)
        return self.segment

    def close(self) -> None:
        if self.segment is not None:
            self.segment.close()
            self.segment = None


class Decoders:
    """The trainer's decoders, one per worker for its current incarnation (the manager's)."""

    def __init__(self) -> None:
        self._by_worker: Dict[int, Decoder] = {}

    def decode(self, worker_id: int, encoded: EncodedSteps) -> Dict[str, Tuple[DecisionSteps, TerminalSteps]]:
        decoder = self._by_worker.get(worker_id)
        if decoder is None:
            decoder = self._by_worker[worker_id] = Decoder()
        return decoder.decode(encoded)

    def segment_name(self, worker_id: int) -> Optional[str]:
        """The segment the worker's current incarnation last named, if any."""
        decoder = self._by_worker.get(worker_id)
        return decoder.segment_name if decoder is not None else None

    def forget(self, worker_id: int) -> None:
        """The worker's incarnation is released: unmap its segment; the next starts afresh."""
        decoder = self._by_worker.pop(worker_id, None)
        if decoder is not None:
            decoder.close()


def departed_segments(prefix: str, last_seen: Optional[str]) -> List[str]:
    """The segments a worker incarnation whose names start with ``prefix`` may have left behind,
    ``last_seen`` being the last one its replies named (NOTE [ Step wire format ])."""
    generation = int(last_seen[len(prefix):]) if last_seen else 0
    return [f"{prefix}{g}" for g in (generation, generation + 1) if g > 0]


def unlink(name: str) -> bool:
    """Remove segment ``name`` if it exists (nothing to do on Windows); call it only once its
    worker is gone. Attaching registers it with this process's resource tracker, which the
    worker shared, and ``unlink`` unregisters it: the tracker forgets it, as it should."""
    if sys.platform == "win32":
        return False
    try:
        segment = shared_memory.SharedMemory(name=name)
    except FileNotFoundError:
        return False
    segment.close()
    segment.unlink()
    return True


def _reserve(segment: shared_memory.SharedMemory) -> Optional[str]:
    """Allocate the segment's pages now (NOTE [ Step wire format ]); why not, if they cannot be.
    Linux only: elsewhere segments are not files of a size-limited tmpfs."""
    if sys.platform != "linux":
        return None
    try:
        fd = os.open(os.path.join(DEV_SHM, segment.name.lstrip("/")), os.O_RDWR)
    except OSError as e:
        return f"the shared memory segment cannot be opened in {DEV_SHM} ({e.strerror})"
    try:
        os.posix_fallocate(fd, 0, segment.size)
    except OSError as e:
        return f"{DEV_SHM} has no room for {_mb(segment.size)} of observations ({e.strerror}; {dev_shm_space()})"
    finally:
        os.close(fd)
    return None


def dev_shm_space() -> str:
    """/dev/shm's size and free space, in words (Linux)."""
    try:
        usage = shutil.disk_usage(DEV_SHM)
    except OSError:
        return f"{DEV_SHM} cannot be read"
    return f"{DEV_SHM} is {_mb(usage.total)}, {_mb(usage.free)} free"


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MB"


def _padded(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN
