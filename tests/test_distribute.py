"""Strategies and XLA under them (keras_vit.training.distribute)."""

import json
import os
import subprocess
import sys

import keras
import pytest
import tensorflow as tf
from helpers import REPO

from keras_vit.training.distribute import (
    compile_model,
    get_strategy,
    is_chief,
    per_replica_batch_size,
)

WORKERS = REPO / "tests" / "workers"
sys.path.insert(0, str(WORKERS))
from common import compile_tiny, tiny_vit  # noqa: E402


def run_parity(jit: int) -> dict:
    proc = subprocess.run(
        [sys.executable, str(WORKERS / "mirrored_parity.py"), "--jit", str(jit)],
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
def test_mirrored_two_cpus_matches_one_device():
    report = run_parity(jit=0)
    assert report["replicas"] == 2 and report["steps"] == 6
    assert report["xla_mode"] is None
    assert report["weights_moved"] > 1e-3  # training did change the weights
    # Differences over the largest weight / loss (the worker's relative_diff).
    assert report["weight_diff"] <= 1e-5, report
    assert report["loss_diff"] <= 1e-5, report


@pytest.mark.slow
def test_mirrored_two_cpus_with_xla_matches_one_device():
    report = run_parity(jit=1)
    assert report["replicas"] == 2 and report["xla_mode"] == "per_replica"
    assert report["weights_moved"] > 1e-3
    assert report["weight_diff"] <= 1e-5, report
    assert report["loss_diff"] <= 1e-5, report
    assert report["weight_diff_vs_single_xla"] <= 1e-5, report
    # XLA is really on: a host-side op in the model cannot be compiled by XLA
    # inside the per-replica step, and trains fine without XLA.
    error = report["pyfunc_under_xla"]
    assert "Detected unsupported operations" in error, error
    assert "forward_backward" in error and "XLA_CPU_JIT" in error, error
    assert report["pyfunc_without_xla"] == "trained"


def test_one_replica_uses_keras_whole_step_xla():
    model = compile_tiny(tiny_vit(), jit_compile=True)
    assert model.xla_mode == "whole_step" and model.jit_compile is True
    assert "train_step" not in vars(model)
    compile_tiny(model, jit_compile=False)
    assert model.xla_mode is None and model.jit_compile is False


def test_auto_jit_without_accelerator_is_off():
    if tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU"):
        pytest.skip("this machine has an accelerator, so 'auto' means XLA on")
    assert compile_tiny(tiny_vit(), jit_compile="auto").xla_mode is None


def test_default_strategy_is_chief():
    assert is_chief(get_strategy("default"))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: get_strategy("horovod"), "Unknown strategy 'horovod'; valid"),
        (
            lambda: get_strategy("default", devices=["/cpu:0"]),
            "only used by 'mirrored'",
        ),
        (
            lambda: get_strategy("mirrored", heartbeat_timeout_seconds=3),
            "only used by 'multiworker'",
        ),
    ],
)
def test_bad_strategy_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize(
    "tf_config, message",
    [
        (None, "needs the TF_CONFIG environment variable"),
        ("{not json", "TF_CONFIG is not valid"),
        (
            '{"cluster": {"worker": []}, "task": {"type": "worker", "index": 0}}',
            "non-empty list",
        ),
        (
            '{"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 0}}',
            "TF_CONFIG is not valid",
        ),
    ],
)
def test_multiworker_needs_valid_tf_config(monkeypatch, tf_config, message):
    if tf_config is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        monkeypatch.setenv("TF_CONFIG", tf_config)
    with pytest.raises(ValueError, match=message):
        get_strategy("multiworker")


def test_multiworker_rejects_bad_timeouts(monkeypatch):
    monkeypatch.setenv(
        "TF_CONFIG",
        json.dumps(
            {
                "cluster": {"worker": ["127.0.0.1:1"]},
                "task": {"type": "worker", "index": 0},
            }
        ),
    )
    with pytest.raises(ValueError, match="heartbeat_timeout_seconds must be > 0"):
        get_strategy("multiworker", heartbeat_timeout_seconds=0)


def test_global_batch_must_split_evenly():
    strategy = get_strategy("default")
    assert per_replica_batch_size(12, strategy) == 12

    class TwoReplicas:
        num_replicas_in_sync = 2

    assert per_replica_batch_size(12, TwoReplicas()) == 6
    with pytest.raises(
        ValueError, match=r"Global batch size 7 .* replicas \(2\), e.g. 8"
    ):
        per_replica_batch_size(7, TwoReplicas())
    with pytest.raises(ValueError, match="Global batch size 0"):
        per_replica_batch_size(0, strategy)


def test_compile_model_refuses_bad_arguments():
    model = tiny_vit()
    with pytest.raises(ValueError, match="jit_compile must be True, False or 'auto'"):
        compile_model(model, jit_compile="yes", loss="mse")
    with pytest.raises(ValueError, match="exclude each other"):
        compile_model(model, jit_compile=True, run_eagerly=True, loss="mse")
    mirrored = get_strategy("mirrored", devices=["/cpu:0"])
    with pytest.raises(
        ValueError, match=r"build the model inside `strategy.scope\(\)`"
    ):
        compile_model(model, strategy=mirrored, loss="mse")
    with mirrored.scope():
        mirrored_model = tiny_vit()
    with pytest.raises(ValueError, match="optimizer was created outside"):
        compile_model(
            mirrored_model,
            strategy=mirrored,
            optimizer=keras.optimizers.AdamW(1e-3),
            loss="mse",
        )
