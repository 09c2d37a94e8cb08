"""MultiWorkerMirroredStrategy with two worker processes on 127.0.0.1."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import REPO, assert_close

WORKERS = REPO / "tests" / "workers"
sys.path.insert(0, str(WORKERS))
from common import compile_tiny, stream, tiny_vit  # noqa: E402


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def start_workers(tmp_path, *args):
    """Starts two workers sharing one run folder; each gets its own TMPDIR so
    that what a worker leaves behind can be checked."""
    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(2)]}
    procs = []
    for index in range(2):
        scratch = tmp_path / f"tmp_{index}"
        scratch.mkdir()
        env = {
            **os.environ,
            "TF_CPP_MIN_LOG_LEVEL": "3",
            "TMPDIR": str(scratch),
            "TF_CONFIG": json.dumps(
                {"cluster": cluster, "task": {"type": "worker", "index": index}}
            ),
        }
        command = [
            sys.executable,
            str(WORKERS / "multiworker.py"),
            str(tmp_path / "run"),
            str(tmp_path / f"worker_{index}"),
            *args,
        ]
        procs.append(
            subprocess.Popen(
                command,
                env=env,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return procs


@pytest.mark.slow
def test_two_workers_train_two_epochs_identically_with_xla(tmp_path):
    procs = start_workers(tmp_path, "--steps", "3", "--epochs", "2", "--jit", "1")
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, out + err[-4000:]
            outputs.append(out)
    finally:
        for proc in procs:
            proc.kill()
    assert "chief=True xla=per_replica" in outputs[0]
    assert "chief=False xla=per_replica" in outputs[1]

    weights = [np.load(tmp_path / f"worker_{i}.npz") for i in range(2)]
    for name in weights[0]:
        np.testing.assert_array_equal(weights[0][name], weights[1][name])
    # The same 6 global batches of 8 on one device (no XLA) give the same
    # weights: each worker trained on its half of every global batch.
    model = compile_tiny(tiny_vit())
    model.fit(stream(), steps_per_epoch=3, epochs=2, verbose=0)
    # Gradients summed over two halves instead of one batch: float32
    # reassociation, which Adam's steps carry into every weight alike, so the
    # bound is a fraction of the largest weight.
    expected = model.get_weights()
    scale = max(float(np.abs(w).max()) for w in expected)
    for i, want in enumerate(expected):
        assert_close(weights[0][f"arr_{i}"], want, 1e-5, scale=scale, what=str(i))

    # Only the chief's checkpoints; the other worker's scratch copies are gone.
    assert sorted(os.listdir(tmp_path / "run")) == [
        "checkpoints.json",
        "ckpt-00000003.weights.h5",
        "ckpt-00000006.weights.h5",
    ]
    assert os.listdir(tmp_path / "tmp_0") == [] and os.listdir(tmp_path / "tmp_1") == []


@pytest.mark.slow
def test_a_dead_worker_makes_the_other_fail_fast(tmp_path):
    heartbeat = 3.0
    procs = start_workers(
        tmp_path, "--steps", "1000", "--sleep", "0.2", "--heartbeat", str(heartbeat)
    )
    try:
        log = tmp_path / "worker_0.steps.log"
        deadline = time.monotonic() + 240
        while not (log.exists() and len(log.read_text().splitlines()) >= 3):
            assert all(p.poll() is None for p in procs), procs[0].stderr.read()
            assert time.monotonic() < deadline, "the workers never trained"
            time.sleep(0.05)
        procs[1].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        try:
            _, err = procs[0].communicate(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("the chief hung for 60 s after its peer died")
        waited = time.monotonic() - killed
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert procs[0].returncode != 0
    assert "stopped sending heartbeats" in err, err[-4000:]
    # Heartbeat timeout plus one step and the error's way out; measured ~5 s.
    assert waited < 10 * heartbeat, waited
    print(f"chief failed {waited:.1f} s after its peer was killed")
