"""CI's smoke run of the benchmarks: they run, and write their report. Speed is not asserted
here (the machine is shared); docs/benchmarks.md has the figures of full runs."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def quick_bench(out: Path, *args: str) -> dict:
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench.py"), "--quick", "--out", str(out), *args],
        capture_output=True, text=True, timeout=580,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "## " in (out / "bench.md").read_text()
    return json.loads((out / "bench.json").read_text())


@pytest.mark.timeout(600)
def test_quick_benchmarks_run_and_report(tmp_path):
    report = quick_bench(tmp_path, "--only", "throughput", "trainer", "unity", "startup", "faults", "drift")
    assert {"throughput", "trainer", "unity", "startup", "faults", "drift"} <= set(report)
    assert all(row["results"]["ours"]["env_steps_per_s"] > 0 for row in report["throughput"])
    for row in report["trainer"]:
        assert set(row["results"]) == {"ours", "ours per worker", "upstream", "bare pipe"}
        assert all(r["env_steps_per_s"] > 0 and r["whole_run_s"] > 0 for r in row["results"].values())
    assert all(row["ours"]["cold_startup_s"] > 0 for row in report["startup"])


@pytest.mark.parametrize("run", ["chaos", "compare-faults", "ray-faults", "ray-scale", "training-python", "ppo-update"])
@pytest.mark.timeout(120)
def test_bench_py_is_the_front_of_every_stand_alone_run(run):
    """``bench.py RUN --help`` reaches the run's own options (benchmarks/README.md's commands)."""
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench.py"), run, "--help"],
        capture_output=True, text=True, timeout=110,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage:" in result.stdout


@pytest.mark.ray
@pytest.mark.xdist_group("ray")
@pytest.mark.timeout(600)
def test_quick_ray_benchmark_runs_on_the_session_cluster(ray_cluster, tmp_path):
    report = quick_bench(tmp_path, "--only", "ray", "--ray-address", ray_cluster.address)
    assert all(row["results"]["ray"]["env_steps_per_s"] > 0 for row in report["ray"])
    ray_cluster.assert_no_outside_connects()


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_quick_training_benchmark_runs_all_three_managers(tmp_path):
    """Stock mlagents-learn on player builds and the trainer loop on Python envs, with
    upstream's manager, ours unbatched and ours batched: each trains and is measured."""
    report = quick_bench(tmp_path, "--only", "training")
    for row in report["training"]:
        assert set(row["results"]) == {"upstream", "ours unbatched", "ours batched"}
        for figures in row["results"].values():
            assert figures["agent_steps_per_s"] > 0 and figures["evaluate_per_env_step"] > 0
        results = row["results"]
        assert results["ours batched"]["evaluate_per_env_step"] < results["upstream"]["evaluate_per_env_step"]


@pytest.mark.e2e
@pytest.mark.timeout(400)
def test_a_short_chaos_run_passes(tmp_path):
    """benchmarks/chaos.py for 20 s: every fault explained and counted, nothing left."""
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "chaos.py"), "--duration", "20", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=380,
    )
    assert result.returncode == 0 and "PASSED" in result.stdout, result.stdout[-4000:] + result.stderr[-2000:]
    report = json.loads(result.stdout[result.stdout.index("{"):result.stdout.rindex("}") + 1])
    assert report["faults_total"] >= 3 and not report["unexplained"]


@pytest.mark.timeout(300)
def test_one_fault_scenario_runs_against_both_managers(tmp_path):
    """benchmarks/compare_faults.py, its quickest scenario: the report has a cell for each manager."""
    saved = tmp_path / "faults.md"
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "compare_faults.py"), "--only", "unrebuildable",
         "--save", str(saved)],
        capture_output=True, text=True, timeout=280,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = saved.read_text()
    assert "upstream" in report.lower() and "ours" in report.lower(), report
