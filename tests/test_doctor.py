"""`python -m mlagents_plugin doctor` on this installation."""
import subprocess
import sys

import pytest


@pytest.mark.timeout(120)
def test_doctor_finds_nothing_wrong_with_the_project_install():
    result = subprocess.run(
        [sys.executable, "-m", "mlagents_plugin", "doctor"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "mlagents-envs    1.1.0" in result.stdout
    assert "All good" in result.stdout
