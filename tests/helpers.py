"""Helpers for tests that run the real mlagents-learn CLI, players and ports."""
import os
import random
import socket
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import yaml

REPO = Path(__file__).resolve().parents[1]
MLAGENTS_LEARN = str(Path(sys.executable).parent / "mlagents-learn")


def free_port_block(size: int) -> int:
    """The first of ``size`` consecutive free ports. Random, so parallel tests rarely meet; a
    port taken between this check and its use makes mlagents-envs raise
    UnityWorkerInUseException, which the manager answers by moving to another port."""
    rng = random.Random(os.getpid() ^ int.from_bytes(os.urandom(4), "little"))
    for _ in range(200):
        base = rng.randrange(20000, 60000 - size)
        try:
            for port in range(base, base + size):
                with socket.socket() as s:
                    s.bind(("localhost", port))
            return base
        except OSError:
            continue
    raise RuntimeError("no free block of ports")


def write_config(tmp_path: Path, name: str, edit=None) -> Path:
    """A copy of config/<name> in tmp_path, optionally changed by ``edit(config_dict)``."""
    config = yaml.safe_load((REPO / "config" / name).read_text())
    if edit is not None:
        edit(config)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return path


def learn_command(config: Path, *args: str) -> List[str]:
    return [MLAGENTS_LEARN, str(config), "--run-id=run", "--results-dir=results", "--force", *args]


def run_learn(tmp_path: Path, config: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        learn_command(config, *args), cwd=tmp_path, capture_output=True, text=True, timeout=timeout
    )


def scalars(run_dir: Path, behavior: str) -> Dict[str, List[float]]:
    """Every scalar TensorBoard recorded for a behaviour, by tag."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run_dir / behavior), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {tag: [e.value for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}
