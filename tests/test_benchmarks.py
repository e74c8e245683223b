"""CI's smoke run of the benchmarks: they run, and write their report. Speed is not asserted
here (the machine is shared); docs/benchmarks.md has the figures of full runs."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(600)
def test_quick_benchmarks_run_and_report(tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench.py"), "--quick", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=580,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "bench.json").read_text())
    assert {"throughput", "unity", "faults", "drift"} <= set(report)
    assert all(row["results"]["ours"]["env_steps_per_s"] > 0 for row in report["throughput"])
    assert "## throughput" in (tmp_path / "bench.md").read_text()
