"""CI's smoke run of the benchmarks: they run, and write their report. Speed is not asserted
here (the machine is shared); docs/benchmarks.md has the figures of full runs."""
import importlib.util
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
    # one pipe baseline (benchmarks/steppers.py's BarePipeEnvManager), under one name in both sections
    assert all({"ours", "upstream", "bare pipe"} <= set(row["results"]) for row in report["throughput"])
    for row in report["trainer"]:
        assert set(row["results"]) == {"ours", "ours per worker", "upstream", "bare pipe"}
        assert all(r["env_steps_per_s"] > 0 and r["whole_run_s"] > 0 for r in row["results"].values())
    assert all(row["ours"]["cold_startup_s"] > 0 for row in report["startup"])


@pytest.mark.parametrize(
    "run", ["chaos", "compare-faults", "ray-faults", "ray-scale", "training-python", "training-trainers", "ppo-update",
            "learning"]
)
@pytest.mark.timeout(120)
def test_bench_py_is_the_front_of_every_stand_alone_run(run):
    """``bench.py RUN --help`` reaches the run's own options (benchmarks/README.md's commands)."""
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench.py"), run, "--help"],
        capture_output=True, text=True, timeout=110,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage:" in result.stdout


@pytest.mark.timeout(120)
def test_quick_learning_benchmark_reports_a_table_and_draws_its_curves(tmp_path):
    """``bench.py learning --quick``: one case, ``ppo`` and ``ppo_fast``, one seed each, each in a
    process of its own; the table on stdout, the picture and the runs in --out (not docs/)."""
    docs_png = REPO / "docs" / "learning_curves.png"
    before = docs_png.stat().st_mtime_ns if docs_png.exists() else None
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench.py"), "learning", "--quick", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=110,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "| case | type | success" in result.stdout and "| discrete | `ppo` |" in result.stdout, result.stdout
    assert "|  | `ppo_fast` |" in result.stdout and "Verdict:" in result.stdout, result.stdout
    assert (tmp_path / "learning_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads((tmp_path / "learning.json").read_text())
    assert sorted(run["trainer_type"] for run in report["runs"]) == ["ppo", "ppo_fast"]
    assert all(run["steps"] and len(run["seconds"]) == len(run["rewards"]) for run in report["runs"])
    assert (docs_png.stat().st_mtime_ns if docs_png.exists() else None) == before


def learning_module():
    spec = importlib.util.spec_from_file_location("learning", REPO / "benchmarks" / "learning.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.fast
def test_the_learning_verdict_takes_noise_and_refuses_a_worse_learner():
    """benchmarks/learning.py's criterion: success counts at most max(1, N/5) of N apart, and each
    type's median final reward within the other's range over seeds; fewer than 3 seeds: no verdict."""
    judge = learning_module().judge

    def scores(*finals):
        return [{"final": f, "success": f > 0.9} for f in finals]

    noisy = judge(scores(0.93, 0.94, 0.92, 0.5, 0.95), scores(0.94, 0.93, 0.92, 0.91, 0.6))  # 4 and 4 of 5
    assert noisy == (True, "equal within noise")
    assert judge(scores(0.93, 0.94, 0.92, 0.95, 0.94), scores(0.93, 0.2, 0.1, 0.3, 0.94))[0] is False  # 5 against 2
    ok, why = judge(scores(0.93, 0.94, 0.95, 0.5, 0.4), scores(0.92, 0.91, 0.7, 0.6, 0.65))  # 3 against 2, but lower
    assert ok is False and why == "ppo's median final reward 0.930 outside ppo_fast's [0.600, 0.920]"
    assert judge(scores(0.9), scores(0.1))[0] is None


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
