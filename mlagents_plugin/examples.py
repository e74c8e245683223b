"""The example configurations the docs use, wherever the package is installed from.

The wheel carries them inside the package (setup.py maps the checkout's ``config/`` there); an
editable install of a checkout reads the checkout's ``config/``. ``python -m mlagents_plugin
examples DIR`` writes them, with a build of the headless player, so that the commands of the
README run from DIR.
"""
from pathlib import Path
from typing import List

from mlagents_plugin.player.build import make_build

CONFIGS = ("goal_player.yaml", "simple_python_env.yaml")


def config_file(name: str) -> Path:
    """The path of the example configuration ``name`` (one of CONFIGS)."""
    if name not in CONFIGS:
        raise ValueError(f"no example configuration {name!r}; there are: {', '.join(CONFIGS)}")
    packaged = Path(__file__).resolve().parent / "config"  # from a wheel or an sdist
    folder = packaged if packaged.is_dir() else Path(__file__).resolve().parents[1] / "config"
    return folder / name


def write(directory: str) -> List[Path]:
    """Write DIR/config/<each example> and DIR/builds/goal (the player's goal scene as a build)."""
    config_dir = Path(directory) / "config"
    config_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name in CONFIGS:
        target = config_dir / name
        target.write_text(config_file(name).read_text())
        written.append(target)
    written.append(make_build(str(Path(directory) / "builds"), "goal"))
    return written
