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


@pytest.mark.bfloat16
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
    # A committed result names no machine's folders (the --json path is
    # outside the repository here).
    assert str(tmp_path) not in out.read_text()
    printed = capsys.readouterr().out
    assert "| train | keras_vit | no jit |" in printed
    assert "matmul-bound ceiling" in printed
    assert f"wrote {out}" in printed


def test_results_record_paths_relative_to_the_repository(throughput, monkeypatch):
    repo = Path(__file__).resolve().parents[1]
    record = throughput.recorded
    assert record(repo / "bench" / "results" / "x.json") == "bench/results/x.json"
    assert record(str(repo / "runs" / "digits" / "model.keras")) == (
        "runs/digits/model.keras"
    )
    assert record("/elsewhere/scratch/x.json") == "x.json"
    assert record("runs/digits/model.keras") == "runs/digits/model.keras"
    assert record("") == "" and record(None) is None and record(3) == 3
    monkeypatch.setattr(
        sys, "argv", ["bench/x.py", "--json=/scratch/a.json", "--model", "/m/b.keras"]
    )
    command = throughput.recorded_command()
    assert command.endswith("bench/x.py --json=a.json --model b.keras")


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


@pytest.mark.bfloat16
def test_auto_check_reports_the_choice_against_every_fixed_setting(
    throughput, tmp_path, capsys
):
    out = tmp_path / "auto.json"
    code = throughput.main([
        "--variant", "Ti/16", "--num-layers", "1", "--image-size", "16",
        "--batch-size", "2", "--num-classes", "3", "--iterations", "1",
        "--rounds", "1", "--warmup", "1", "--matmul-size", "64",
        "--peers", "keras_vit", "--modes", "infer", "--auto-check",
        "--json", str(out),
    ])  # fmt: skip
    assert code == 0
    report = json.loads(out.read_text())
    settings = {r["setting"] for r in report["results"]}
    # Both precisions, with and without XLA: every setting auto can pick.
    assert settings == {"jit", "no jit", "mixed_bfloat16 jit", "mixed_bfloat16 no jit"}
    auto = report["auto"]
    assert auto["setting"] in settings
    infer = auto["infer"]
    assert infer["best_setting"] in settings
    assert infer["auto_over_best"] == pytest.approx(
        infer["auto_images_per_second"] / infer["best_images_per_second"]
    )
    assert report["environment"]["cpu_flags"] == [
        f for f in ("avx2", "fma", "avx512f") if f in report["environment"]["cpu_flags"]
    ] + [
        f
        for f in report["environment"]["cpu_flags"]
        if f.startswith(("avx512_", "amx"))
    ]
    assert "auto setting:" in capsys.readouterr().out


def test_input_pipeline_bench_runs_tiny_and_reports_every_stage(tmp_path, capsys):
    pipeline = _load("input_pipeline")
    out = tmp_path / "pipeline.json"
    code = pipeline.main([
        "--num-images", "8", "--image-size", "32", "--batch-size", "4",
        "--batches", "1", "--rounds", "1", "--min-side", "40", "--max-side", "48",
        "--model-images-per-second", "10", "--json", str(out),
    ])  # fmt: skip
    assert code == 0
    report = json.loads(out.read_text())
    got = [(r["source"], r["stage"]) for r in report["results"]]
    assert got == [(s, t) for s in pipeline.SOURCES for t in pipeline.STAGES]
    for r in report["results"]:
        assert r["images_per_second"] > 0
        assert r["over_model_training"] == pytest.approx(r["images_per_second"] / 10)
    assert report["environment"]["cpu_flags"] is not None
    assert report["config"]["json"] == "pipeline.json"
    assert "| tfrecord | +MixUp 0.8 / CutMix 1.0 |" in capsys.readouterr().out


def test_jpeg_tfrecords_round_trip_through_the_tfrecord_source(tmp_path):
    import numpy as np

    from keras_vit.training import data, sources
    from keras_vit.training.config import DataConfig

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (4, 12, 12, 3), dtype=np.uint8)
    files = sources.write_tfrecords(
        images, [0, 1, 0, 1], tmp_path, "train", image_format="jpeg"
    )
    assert files[0].endswith("train-00000-of-00001.tfrecord")
    config = DataConfig(
        source="tfrecord", path=str(tmp_path), num_classes=2, mean=(0,), std=(1,)
    )
    batch, labels = next(iter(data.make_train_dataset(config, 12, 4, seed=0)))
    assert batch.shape == (4, 12, 12, 3) and labels.shape == (4, 2)
    with pytest.raises(ValueError, match="image_format must be 'png' or 'jpeg'"):
        sources.write_tfrecords(images, [0, 1, 0, 1], tmp_path, image_format="gif")


@pytest.mark.bfloat16
def test_fused_kernels_bench_runs_tiny_with_its_profile(tmp_path, capsys):
    bench = _load("fused_kernels")
    out = tmp_path / "fused.json"
    code = bench.main([
        "--variant", "Ti/16", "--num-layers", "1", "--image-size", "32",
        "--batch-size", "2", "--rounds", "2", "--steps", "1", "--profile",
        "--json", str(out),
    ])  # fmt: skip
    assert code == 0
    report = json.loads(out.read_text())
    assert set(report["rounds_images_per_second"]) == {"fused", "plain"}
    assert report["config"]["json"] == "fused.json"
    assert all(len(v) == 2 for v in report["rounds_images_per_second"].values())
    profile = report["profile"]
    # The plain step runs GELU and LayerNorm as TensorFlow ops; the fused
    # step has none of either (they are XLA kernels there).
    assert profile["plain"]["op_seconds"]["gelu"] > 0
    assert profile["plain"]["op_seconds"]["layernorm"] > 0
    assert "gelu" not in profile["fused"]["op_seconds"]
    assert "layernorm" not in profile["fused"]["op_seconds"]
    assert profile["fused"]["op_seconds"]["matmul"] > 0
    assert "fused / plain:" in capsys.readouterr().out
