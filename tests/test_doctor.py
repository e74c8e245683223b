"""`python -m mlagents_plugin doctor` on this installation, and on installations broken as users
break them (issue 32): each problem is one line with its fix, never a traceback."""
import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

import mlagents_plugin


@pytest.mark.timeout(120)
def test_doctor_finds_nothing_wrong_with_the_project_install():
    result = subprocess.run(
        [sys.executable, "-m", "mlagents_plugin", "doctor"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "mlagents-envs    1.1.0" in result.stdout
    assert "All good" in result.stdout


# sitecustomize modules, each put on PYTHONPATH of a real doctor process. They break the stdlib's
# and numpy's behaviour only, never the plugin's own code.
SHIMS = {
    # numpy 1.24 removed the aliases numpy 1.20 deprecated (np.float, np.int, ...): with numpy
    # 1.24 or 2.x, importing mlagents.trainers raises "AttributeError: module 'numpy' has no
    # attribute 'float'" (buffer.py's annotations). The installed numpy, made to behave so.
    "numpy_without_np_float": "import numpy\nnumpy.__deprecated_attrs__.clear()\n",
    # numpy itself does not import (a half-installed or mismatched build).
    "numpy_does_not_import": (
        "import sys\n"
        "class _Broken:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'numpy' or name.startswith('numpy.'):\n"
        "            raise ImportError('numpy.core.multiarray failed to import')\n"
        "sys.meta_path.insert(0, _Broken())\n"
    ),
    # A Python whose multiprocessing no longer has a private the fork server relies on
    # (local/fork_server.py's INTERNALS).
    "multiprocessing_private_gone": "import multiprocessing.util\ndel multiprocessing.util._flush_std_streams\n",
    # The plugin's distribution metadata is not found (run from a checkout that was never installed).
    "plugin_not_installed": (
        "import importlib.metadata as m\n"
        "_version = m.version\n"
        "def version(name):\n"
        "    if name.replace('_', '-').lower() == 'mlagents-plugin':\n"
        "        raise m.PackageNotFoundError(name)\n"
        "    return _version(name)\n"
        "m.version = version\n"
    ),
}


def _doctor_with(shim: str, tmp_path: Path) -> subprocess.CompletedProcess:
    (tmp_path / "shim").mkdir()
    (tmp_path / "shim" / "sitecustomize.py").write_text(SHIMS[shim])
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "shim"))
    # cwd outside the checkout: `python -m` puts the cwd first on sys.path, and the 3.10 leg tests
    # the installed wheel.
    return subprocess.run(
        [sys.executable, "-m", "mlagents_plugin", "doctor"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=100,
    )


def _numpy_pin() -> str:
    """numpy as the installed mlagents-envs asks for it: 'numpy<1.24.0,>=1.23.5' (1.1.0) or 'numpy==1.21.2'."""
    [pin] = [r for r in importlib.metadata.requires("mlagents-envs") or [] if re.match(r"numpy\b", r, re.I)]
    return pin.split(";")[0].replace(" ", "")


def _problems(result: subprocess.CompletedProcess):
    assert "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
    assert result.returncode == 1, result.stdout + result.stderr
    return [line for line in result.stdout.splitlines() if line.startswith("  - ")]


@pytest.mark.timeout(120)
def test_a_numpy_that_breaks_mlagents_is_one_line_with_the_fix(tmp_path):
    """Issue 32: with numpy 2.2.6 in ML-Agents' environment the doctor died with a 41-line traceback."""
    result = _doctor_with("numpy_without_np_float", tmp_path)
    [problem] = _problems(result)
    assert "`mlagents-learn` cannot start" in problem
    assert "AttributeError: module 'numpy' has no attribute 'float'" in problem
    assert f"pip install '{_numpy_pin()}'" in problem


@pytest.mark.timeout(120)
def test_a_numpy_that_does_not_import_is_one_line_with_the_fix(tmp_path):
    result = _doctor_with("numpy_does_not_import", tmp_path)
    [problem] = _problems(result)
    assert "cannot be imported (ImportError: numpy.core.multiarray failed to import)" in problem
    assert f"pip install --force-reinstall '{_numpy_pin()}'" in problem


@pytest.mark.timeout(120)
def test_a_python_without_a_multiprocessing_private_the_fork_server_uses_is_one_line(tmp_path):
    result = _doctor_with("multiprocessing_private_gone", tmp_path)
    [problem] = _problems(result)
    assert f"Python {sys.version.split()[0]}: multiprocessing.util:_flush_std_streams is missing" in problem
    assert problem.endswith("(local/fork_server.py).")


@pytest.mark.timeout(120)
def test_a_missing_plugin_is_told_an_install_that_works(tmp_path):
    """The name is not on PyPI yet: the advice is this checkout, or the wheel."""
    result = _doctor_with("plugin_not_installed", tmp_path)
    [problem] = [line for line in _problems(result) if "mlagents-plugin is not installed" in line]
    assert "pip install mlagents-plugin" not in problem
    if Path(mlagents_plugin.__file__).resolve().parent.parent == REPO:  # editable, or run from the checkout
        assert f"pip install {REPO} " in problem
    else:  # an installed wheel (the 3.10 legs)
        assert "pip install mlagents_plugin-0.1.0-py3-none-any.whl" in problem
