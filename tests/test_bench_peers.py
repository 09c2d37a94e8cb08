"""bench/peers.py and bench/gpu_check.py run tiny and write their JSON.

Not timing tests: the figures depend on the machine and its load. They check
that the scripts a quiet or GPU machine will run produce complete reports.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"


def run_script(name: str, *args: str, timeout: float = 900):
    proc = subprocess.run(
        [sys.executable, str(BENCH / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO)},
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow
def test_peers_without_their_venvs_skip_them_and_run_keras_vit(tmp_path):
    report_path = tmp_path / "peers.json"
    out = run_script(
        "peers.py",
        "--venvs", str(tmp_path / "no_venvs"),
        "--num-layers", "1", "--image-sizes", "32", "--batch-sizes", "2",
        "--modes", "train,infer", "--precisions", "float32", "--no-jit", "--remat",
        "--rounds", "1", "--steps", "1", "--warmup", "1",
        "--json", str(report_path),
    )  # fmt: skip
    skips = [line for line in out.splitlines() if line.startswith("skip ")]
    assert [line.split(":")[0] for line in skips] == ["skip keras_hub", "skip timm"]
    report = json.loads(report_path.read_text())
    results = report["results"]
    assert {(r["mode"], r["setting"]) for r in results} == {
        ("train", "float32"),
        ("train", "float32 remat"),
        ("infer", "float32"),
        ("infer", "float32 kernels"),  # within fused.inference()
    }
    assert {r["peer"] for r in results} == {"keras_vit"}
    for result in results:
        assert result["errors"] == [] and result["best_images_per_second"] > 0
        assert result["peak_rss_mib"] > result["step_memory_mib"] > 0
        assert "keras" in result["versions"]
    assert "cpu_flags" in report["environment"]
    assert "keras_vit" in report["best"][0]


def test_peers_refuses_an_unknown_peer(capsys):
    proc = subprocess.run(
        [sys.executable, str(BENCH / "peers.py"), "--peers", "keras_vit,flax"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "--peers ['flax']: valid values are" in proc.stderr


@pytest.mark.bfloat16
@pytest.mark.slow
def test_gpu_check_runs_on_two_logical_cpus(tmp_path):
    report_path = tmp_path / "gpu_check.json"
    out = run_script(
        "gpu_check.py",
        "--cpu-devices", "2", "--variant", "Ti/16", "--num-layers", "2",
        "--image-size", "32", "--per-replica-batch", "2",
        "--steps", "2", "--warmup", "1", "--json", str(report_path),
    )  # fmt: skip
    report = json.loads(report_path.read_text())
    assert report["replicas"] == 2 and report["global_batch"] == 4
    rows = {(r["precision"], r["remat"]): r for r in report["rows"]}
    assert set(rows) == {
        (p, remat) for p in ("mixed_bfloat16", "mixed_float16") for remat in (0, 1)
    }
    for row in rows.values():
        assert row["images_per_second"] > 0 and 0 < row["mfu"] < 1
        assert row["peak_memory_mib"] > 0
    # float32 on one replica and on two, the same global batches: the same
    # losses up to summation order (1e-5 relative, as the parity tests).
    assert report["parity"]["max_relative_diff"] <= 1e-5, report["parity"]
    assert "| mixed_float16 | yes |" in out
