"""Gradient accumulation with two replicas (keras_vit.training.accumulate)."""

import json
import os
import subprocess
import sys

import pytest
from helpers import REPO

WORKERS = REPO / "tests" / "workers"


def run_accumulation(jit: int) -> dict:
    proc = subprocess.run(
        [sys.executable, str(WORKERS / "accumulation_parity.py"), "--jit", str(jit)],
        capture_output=True,
        text=True,
        timeout=400,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        cwd=REPO,
    )
    lines = [x for x in proc.stdout.splitlines() if x.startswith("REPORT ")]
    assert proc.returncode == 0 and lines, proc.stdout + proc.stderr[-4000:]
    return json.loads(lines[-1][len("REPORT ") :])


@pytest.mark.slow
@pytest.mark.parametrize("jit", [0, 1])
def test_four_steps_on_two_replicas_give_the_full_batch_gradient(jit):
    report = run_accumulation(jit)
    assert report["replicas"] == 2
    assert report["xla_mode"] == ("per_replica" if jit else None)
    # Nothing is applied before the fourth step, then exactly one update.
    assert report["moved_before_last_step"] == 0.0, report
    assert report["optimizer_steps"] == 1, report
    # Gradients worth comparing, on every weight.
    assert report["smallest_weight_gradient"] > 1e-6, report
    # float32 sums over batches split 2 x 4 ways instead of one: within 1e-5
    # of the largest gradient entry.
    assert report["relative_diff"] <= 1e-5, report
