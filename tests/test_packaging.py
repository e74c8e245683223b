"""What ``pip install mlagents-plugin`` gets: an sdist and a wheel built from this checkout hold
everything a user runs, and nothing needs the checkout (docs/install.md); both carry the metadata a
public release needs, and ask for nothing in a way that could move a pin of ML-Agents (issue 32)."""
import fcntl
import importlib.metadata
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

import pytest
from helpers import REPO
from packaging.requirements import Requirement

pytestmark = pytest.mark.timeout(300)
_BUILD_LOCK = Path(tempfile.gettempdir()) / "mlagents-plugin-tests-build.lock"

# What a user runs from the wheel: the docs' configurations, the player, the pytest plugin, the
# .pth that serves protobuf 6 to mlagents-envs on Python 3.11, the Linux hardening's scripts.
IN_THE_WHEEL = [
    "mlagents_plugin/config/goal_player.yaml",
    "mlagents_plugin/config/simple_python_env.yaml",
    "mlagents_plugin/player/__main__.py",
    "mlagents_plugin/testing/pytest_plugin.py",
    "mlagents_plugin/local/linux/reaper.py",
    "mlagents_plugin/local/linux/die_with_parent.py",
    "mlagents_plugin_fast_protobuf.pth",
]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """``python -m build``: an sdist, and a wheel built from that sdist (as pip does from PyPI)."""
    out = tmp_path_factory.mktemp("dist")
    # Building writes mlagents_plugin.egg-info/ and build/ in the checkout: under pytest-xdist each
    # worker that runs a test of this module builds, and two builds at once break each other.
    with open(_BUILD_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other holds it for seconds; pytest-timeout bounds the wait
        built = subprocess.run(
            [sys.executable, "-m", "build", "--outdir", str(out), str(REPO)], capture_output=True, text=True
        )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return out


def _metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        return archive.read("mlagents_plugin-0.1.0.dist-info/METADATA").decode()


def _wheel_files(wheel: Path):
    with zipfile.ZipFile(wheel) as archive:
        return sorted(archive.namelist())


def test_the_wheel_holds_everything_a_user_runs(built):
    [wheel] = built.glob("*.whl")
    files = _wheel_files(wheel)
    for name in IN_THE_WHEEL:
        assert name in files
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read("mlagents_plugin-0.1.0.dist-info/METADATA").decode()
        entry_points = archive.read("mlagents_plugin-0.1.0.dist-info/entry_points.txt").decode()
    assert "Requires-Python: >=3.10" in metadata
    assert "Requires-Dist: setuptools<81" in metadata
    assert 'Requires-Dist: grpcio>=1.49; python_version >= "3.11"' in metadata
    assert "mlagents_plugin = mlagents_plugin.integration.entry:register" in entry_points
    assert "mlagents_plugin = mlagents_plugin.testing.pytest_plugin" in entry_points


def test_a_wheel_built_from_a_clone_matches_the_one_from_the_sdist(built, tmp_path):
    """``pip install .`` from a clone builds the wheel ``pip install mlagents-plugin`` gets."""
    [sdist] = built.glob("*.tar.gz")
    with tarfile.open(sdist) as archive:
        assert any(name.endswith("/config/goal_player.yaml") for name in archive.getnames())
    clone = tmp_path / "clone"  # this checkout's files, as a fresh clone has them (no build/ of earlier builds)
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, check=True, capture_output=True, text=True,
    ).stdout.split()
    for name in listed:
        if (REPO / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, clone / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(clone)],
        check=True, capture_output=True,
    )
    [from_clone] = tmp_path.glob("*.whl")
    [from_sdist] = built.glob("*.whl")
    assert _wheel_files(from_clone) == _wheel_files(from_sdist)


def test_the_installed_wheel_needs_no_checkout(built, tmp_path):
    """Installed elsewhere, the examples come from the package, not from this checkout."""
    [wheel] = built.glob("*.whl")
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        check=True, capture_output=True,
    )
    code = "import mlagents_plugin.examples as e; print(e.config_file('goal_player.yaml'))"
    found = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(target)!r}); {code}"],
        check=True, capture_output=True, text=True, cwd=tmp_path,
    ).stdout.strip()
    assert Path(found) == target / "mlagents_plugin" / "config" / "goal_player.yaml"
    written = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(target)!r}); "
         "from mlagents_plugin.__main__ import main; main(['examples', 'out'])"],
        check=True, capture_output=True, text=True, cwd=tmp_path,
    )
    assert (tmp_path / "out" / "config" / "simple_python_env.yaml").read_text() == (
        target / "mlagents_plugin" / "config" / "simple_python_env.yaml"
    ).read_text(), written.stdout
    assert (tmp_path / "out" / "builds" / "goal.x86_64").exists()


def test_the_sdist_and_the_wheel_pass_twine_check_and_carry_what_a_release_needs(built):
    """What PyPI takes: ``twine check --strict`` on both, the licence file in both, and the fields
    a public release shows."""
    [wheel], [sdist] = built.glob("*.whl"), built.glob("*.tar.gz")
    checked = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel)],
        capture_output=True, text=True, timeout=120,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.count("PASSED") == 2, checked.stdout
    assert "mlagents_plugin-0.1.0.dist-info/licenses/LICENSE" in _wheel_files(wheel)
    with tarfile.open(sdist) as archive:
        assert "mlagents_plugin-0.1.0/LICENSE" in archive.getnames()
        shipped = archive.extractfile("mlagents_plugin-0.1.0/LICENSE").read()
    assert shipped == (REPO / "LICENSE").read_bytes()
    assert b"Apache License" in shipped and b"Version 2.0, January 2004" in shipped
    metadata = _metadata(wheel)
    for field in (
        "License: Apache-2.0", "License-File: LICENSE", "Author: mlagents-plugin developers",
        "Requires-Python: >=3.10", "Description-Content-Type: text/markdown",
        "Classifier: Programming Language :: Python :: 3.10", "Keywords: unity,ml-agents,",
    ):
        assert field in metadata


def test_what_mlagents_also_needs_is_asked_for_with_its_own_bounds(built):
    """``pip install --force-reinstall`` reinstalls each requirement at the newest version it allows,
    whatever installed packages ask for: a requirement looser than ML-Agents' moves its pin (issue
    32: an unbounded numpy took 1.23.5 to 2.2.6). So each requirement on Python 3.10 of a package
    ML-Agents also requires has ML-Agents' own bounds, and numpy, which mlagents-envs 1.0.0 and 1.1.0
    pin differently (==1.21.2; >=1.23.5,<1.24.0), is not asked for at all."""
    [wheel] = built.glob("*.whl")
    ours = [
        Requirement(line.partition(": ")[2]) for line in _metadata(wheel).splitlines()
        if line.startswith("Requires-Dist: ")
    ]
    py310 = {"python_version": "3.10", "python_full_version": "3.10.12", "extra": ""}
    ours = [r for r in ours if r.marker is None or r.marker.evaluate(py310)]
    theirs = {}
    for dist in ("mlagents", "mlagents-envs"):
        for line in importlib.metadata.requires(dist) or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate(py310):
                theirs.setdefault(requirement.name.lower(), []).append((dist, requirement.specifier))
    assert "numpy" in theirs and "numpy" not in {r.name.lower() for r in ours}
    shared = [r for r in ours if r.name.lower() in theirs]
    assert {r.name.lower() for r in shared} >= {"attrs", "cattrs", "cloudpickle", "pillow", "pyyaml"}
    for requirement in shared:
        for dist, specifier in theirs[requirement.name.lower()]:
            assert requirement.specifier == specifier, (str(requirement), dist, str(specifier))
