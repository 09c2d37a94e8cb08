"""bench/throughput.py runs on a tiny config and writes its JSON report.

Not a timing test: the figures depend on the machine and its load.
"""

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    # dataclasses look their module up in sys.modules.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def throughput():
    return _load("throughput")


def test_flop_count_matches_the_published_vit_ti16_figure():
    """The benchmark counts FLOPs with keras_vit.analysis.flops; pin that count."""
    from keras_vit import ViT
    from keras_vit.analysis.flops import macs_by_layer, vit_macs

    # timm / fvcore list ViT-Ti/16 at 224 as 1.26 GMACs (matmuls only).
    assert vit_macs("Ti/16", 224) == 1_253_683_200
    per_layer, uncounted = macs_by_layer(ViT("Ti/16", 224))
    assert not uncounted
    assert sum(per_layer.values()) == 1_253_683_200
    assert per_layer["patch_encoder"] == 196 * 16 * 16 * 3 * 192


def test_ceiling_shapes_are_the_counted_matrix_products(throughput):
    """The matmul-bound ceiling times exactly the products that
    keras_vit.analysis.flops counts."""
    from keras_vit.analysis.flops import vit_macs
    from keras_vit.models.vit import parse_variant

    shapes = throughput.matmul_shapes(parse_variant("Ti/16"), 224, 32, 1000)
    macs = sum(count * math.prod(lhs) * rhs[-1] for _, count, lhs, rhs in shapes)
    assert macs == 32 * vit_macs("Ti/16", 224, 1000)


def test_tiny_run_writes_json_with_expected_keys(throughput, tmp_path, capsys):
    out = tmp_path / "bench.json"
    # timm is asked for but never imported here: importing torch after
    # TensorFlow in one process can crash, so only a torch-less Python asks.
    peers = "keras_vit" if importlib.util.find_spec("torch") else "keras_vit,timm"
    code = throughput.main([
        "--variant", "Ti/16", "--num-layers", "1", "--image-size", "16",
        "--batch-size", "2", "--num-classes", "3", "--iterations", "1",
        "--rounds", "2", "--warmup", "1", "--jit", "off", "--matmul-size", "64",
        "--peers", peers, "--json", str(out),
    ])  # fmt: skip
    assert code == 0
    report = json.loads(out.read_text())
    assert set(report) >= {
        "config", "environment", "matmul_peak_gflops", "model", "results",
        "ratios", "skipped",
    }  # fmt: skip
    assert set(report["matmul_peak_gflops"]) == {"float32", "bfloat16"}
    ceiling = report["matmul_ceiling_images_per_second"]
    assert set(ceiling) == {"train", "infer"}
    # Training runs every product three times (forward, two gradients).
    assert ceiling["infer"] == pytest.approx(3 * ceiling["train"])
    assert set(report["matmul_seconds_per_batch"]) >= {"qkv", "q @ k^T", "fc1"}
    assert all(v > 0 for v in report["matmul_peak_gflops"].values())
    assert report["model"]["parameters"]["keras_vit"] > 0
    assert report["model"]["train_gflops_per_image"] == pytest.approx(
        3 * report["model"]["forward_gflops_per_image"]
    )
    ours = [r for r in report["results"] if r["peer"] == "keras_vit"]
    assert [(r["mode"], r["setting"]) for r in ours] == [
        ("train", "no jit"),
        ("infer", "no jit"),
    ]
    for r in ours:
        assert len(r["rounds_images_per_second"]) == 2
        assert r["images_per_second"] > 0
        assert r["fraction_of_peak"] > 0
        assert r["fraction_of_ceiling"] > 0
        assert r["peak_rss_mib"] > 0
    if "timm" in peers:
        assert "timm" in report["skipped"]
    printed = capsys.readouterr().out
    assert "| train | keras_vit | no jit |" in printed
    assert "matmul-bound ceiling" in printed
    assert f"wrote {out}" in printed


def test_bad_arguments_name_the_valid_values(throughput, capsys):
    with pytest.raises(SystemExit):
        throughput.parse_args(["--peers", "keras_vit,flax"])
    assert "valid values are keras_vit, keras_hub, timm" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        throughput.parse_args(["--warmup", "0"])
    assert "--warmup must be >= 1, got 0" in capsys.readouterr().err


@pytest.mark.slow
def test_script_runs_from_the_command_line():
    result = subprocess.run(
        [sys.executable, str(BENCH / "throughput.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "--precision" in result.stdout and "--json" in result.stdout
