"""Checkpoint conversion: parity with timm / transformers on committed
fixtures (made by scripts/make_fixtures.py, whose seeded tensors
scripts/fixture_common.py rebuilds), and every refusal."""

import ast
import importlib.util
import json
import shutil
import sys
import types
import zipfile
from pathlib import Path

import keras
import numpy as np
import pytest
from helpers import FLOAT32_PARITY, assert_close
from safetensors.numpy import load_file, save_file

from keras_vit.errors import CheckpointError, UnsafeCheckpointError
from keras_vit.files import sha256
from keras_vit.pretrained import hub as hub_module
from keras_vit.pretrained.convert import convert_checkpoint
from keras_vit.pretrained.readers import read_checkpoint

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"


def load_fixture_script():
    spec = importlib.util.spec_from_file_location(
        "fixture_common", REPO / "scripts" / "fixture_common.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parity(name):
    data = np.load(FIXTURES / name / "parity.npz")
    return data["images"], data["logits"]


def check_parity(model, name, relative=1e-4):
    """The source library's logits (torch or JAX on the CPU that made the
    fixture) within `relative` of their scale."""
    x, expected = parity(name)
    out = np.asarray(model(x, training=False))
    assert out.shape == expected.shape
    assert_close(out, expected, relative, what=name)
    return np.abs(out - expected).max()


def copy_fixture(name, tmp_path):
    folder = tmp_path / name
    shutil.copytree(FIXTURES / name, folder)
    return folder


@pytest.fixture(scope="module")
def vit_tiny_checkpoint(tmp_path_factory):
    """timm vit_tiny_patch16_224, rebuilt from the committed spec and seed."""
    spec = json.loads(
        (FIXTURES / "timm_vit_tiny_patch16_224" / "spec.json").read_text()
    )
    fixture_common = load_fixture_script()
    tensors = fixture_common.random_state_dict(spec["tensors"], spec["seed"])
    assert fixture_common.digest(tensors) == spec["sha256"], "numpy stream changed"
    path = tmp_path_factory.mktemp("vit_tiny") / "model.safetensors"
    save_file(tensors, str(path))
    return path


def test_timm_vit_tiny_patch16_224_matches_timm(vit_tiny_checkpoint):
    model = convert_checkpoint(vit_tiny_checkpoint)
    assert model.count_params() == 5_717_416  # timm's count for this model
    assert model.input_shape == (None, 224, 224, 3)
    assert len([n for n in (lyr.name for lyr in model.layers) if "block_" in n]) == 12
    assert model.get_layer("block_0").num_heads == 3
    check_parity(model, "timm_vit_tiny_patch16_224")


@pytest.mark.parametrize(
    "name,overrides",
    [
        ("timm_vit_avg", {}),
        ("timm_vit_r26", dict(norm_groups=8)),
        ("timm_deit_distilled", {}),
        ("timm_deit3", {}),
        ("hf_vit", {}),
        ("hf_vit_model", {}),
        ("hf_vit_model_options", {}),
        ("hf_deit", {}),
        ("augreg_vit", {}),
        ("big_vision_vit", {}),
    ],
)
def test_converted_logits_match_the_source_library(name, overrides):
    model = convert_checkpoint(FIXTURES / name, **overrides)
    check_parity(model, name)


def test_detects_the_architecture_from_tensors_and_config():
    avg = convert_checkpoint(FIXTURES / "timm_vit_avg")
    assert avg.input_shape == (None, 32, 48, 3)
    assert avg.output_shape == (None, 7)
    assert avg.get_layer("patches").patch_size == 8
    assert avg.get_layer("pooling").mode == "gap"
    assert avg.get_layer("patch_encoder").class_token
    assert avg.get_layer("block_0").num_heads == 4
    assert avg.get_layer("block_0").mlp_dim == 192

    hybrid = convert_checkpoint(FIXTURES / "timm_vit_r26", norm_groups=8)
    assert hybrid.get_layer("patches").input.shape == (None, 3, 3, 256)
    assert hybrid.get_layer("stage3_block1_conv3").filters == 256
    assert hybrid.get_layer("stem_conv").epsilon == 1e-8

    hf = convert_checkpoint(FIXTURES / "hf_vit")
    assert hf.get_layer("encoder_norm").epsilon == 1e-12
    assert hf.get_layer("block_1").layer_norm_epsilon == 1e-12

    deit = convert_checkpoint(FIXTURES / "timm_deit_distilled")
    assert deit.get_layer("patch_encoder").num_prefix_tokens == 2
    assert deit.get_layer("head_dist").units == 4
    deit3 = convert_checkpoint(FIXTURES / "timm_deit3")
    assert deit3.get_layer("block_1").layer_scale_init is not None
    # No position embedding on its class token: a zero row.
    pos = deit3.get_layer("patch_encoder").pos_embedding.numpy()
    np.testing.assert_array_equal(pos[:, 0], 0.0)
    pooled = convert_checkpoint(FIXTURES / "hf_vit_model")
    assert pooled.get_layer("pre_logits").units == 32
    assert pooled.output_shape == (None, 32)

    big_vision = convert_checkpoint(FIXTURES / "big_vision_vit" / "model.npz")
    assert not big_vision.get_layer("patch_encoder").class_token
    assert big_vision.get_layer("pooling").mode == "gap"


def test_heads_are_guessed_with_a_warning_when_nothing_says(tmp_path):
    bare = tmp_path / "model.safetensors"
    shutil.copy(FIXTURES / "timm_vit_avg" / "model.safetensors", bare)
    with pytest.warns(UserWarning, match="assuming 1 \\(64-wide heads\\)"):
        guessed = convert_checkpoint(bare, image_size=(32, 48))
    assert guessed.get_layer("block_0").num_heads == 1
    told = convert_checkpoint(bare, image_size=(32, 48), num_heads=4)
    # Without config.json the pooling comes from the tensors: fc_norm -> mean.
    check_parity(told, "timm_vit_avg")


def test_a_new_image_size_resamples_the_position_embedding():
    source = convert_checkpoint(FIXTURES / "timm_vit_avg")
    moved = convert_checkpoint(FIXTURES / "timm_vit_avg", image_size=(64, 96))
    assert moved.get_layer("patch_encoder").grid_size == (8, 12)
    old = source.get_layer("patch_encoder").pos_embedding.numpy()
    new = moved.get_layer("patch_encoder").pos_embedding.numpy()
    assert new.shape == (1, 1 + 8 * 12, 64)
    np.testing.assert_array_equal(new[:, 0], old[:, 0])
    assert moved(np.zeros((1, 64, 96, 3), "float32")).shape == (1, 7)
    hybrid = convert_checkpoint(
        FIXTURES / "timm_vit_r26", image_size=128, norm_groups=8
    )
    assert hybrid.get_layer("patch_encoder").grid_size == (4, 4)


def test_new_head_or_no_head_for_fine_tuning(tmp_path):
    model = convert_checkpoint(FIXTURES / "hf_vit", num_classes=3)
    assert model.output_shape == (None, 3)
    np.testing.assert_array_equal(model.get_layer("head").kernel.numpy(), 0.0)
    reference = convert_checkpoint(FIXTURES / "hf_vit")
    np.testing.assert_array_equal(
        model.get_layer("block_1").weights[0].numpy(),
        reference.get_layer("block_1").weights[0].numpy(),
    )
    features = convert_checkpoint(FIXTURES / "hf_vit", include_top=False)
    assert features.output_shape == (None, 64)


def test_out_path_writes_a_keras_file_that_loads(tmp_path):
    out = tmp_path / "models" / "r26.keras"
    model = convert_checkpoint(FIXTURES / "timm_vit_r26", out, norm_groups=8)
    # The model and its metadata.json (in r26/), no temporary file left.
    assert sorted(p.name for p in out.parent.iterdir()) == ["r26", "r26.keras"]
    assert sorted(p.name for p in (out.parent / "r26").iterdir()) == ["metadata.json"]
    reloaded = keras.saving.load_model(out, safe_mode=True)
    x, _ = parity("timm_vit_r26")
    assert_close(reloaded(x), model(x), FLOAT32_PARITY)


# --- refusals ---------------------------------------------------------------


def edited_safetensors(tmp_path, edit):
    folder = copy_fixture("timm_vit_avg", tmp_path)
    tensors = load_file(str(folder / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def assert_refused(src, error, match, tmp_path, **kwargs):
    out = tmp_path / "never.keras"
    with pytest.raises(error, match=match):
        convert_checkpoint(src, out, **kwargs)
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".keras"]


def test_unknown_tensor_names_are_refused(tmp_path):
    def edit(t):
        t["blocks.0.attn.extra.weight"] = np.ones(16, "float32")

    folder = edited_safetensors(tmp_path, edit)
    assert_refused(
        folder,
        CheckpointError,
        r"nothing was loaded(.|\n)*unknown tensor\(s\) not used by the model: "
        r"\['blocks.0.attn.extra.weight'\]",
        tmp_path,
    )
    # A known feature keras_vit lacks is named (tests/test_pretrained_whole.py).
    folder = edited_safetensors(
        tmp_path / "qk",
        lambda t: t.update({"blocks.0.attn.q_bias": np.ones(16, "float32")}),
    )
    assert_refused(folder, CheckpointError, r"separate query / value biases", tmp_path)


def test_wrong_shapes_are_refused(tmp_path):
    def edit(t):
        t["blocks.1.mlp.fc1.weight"] = np.zeros((100, 64), "float32")

    folder = edited_safetensors(tmp_path, edit)
    assert_refused(
        folder,
        CheckpointError,
        r"blocks.1.mlp.fc1.weight has shape \(100, 64\), which gives \(64, 100\); "
        r"block_1/mlp/fc1/kernel needs \(64, 192\)",
        tmp_path,
    )


def test_malformed_architecture_tensors_are_refused(tmp_path):
    def edit(t):
        t["pos_embed"] = np.zeros(25, "float32")

    folder = edited_safetensors(tmp_path, edit)
    assert_refused(folder, CheckpointError, "unexpected shape", tmp_path)
    folder = edited_safetensors(
        tmp_path / "b", lambda t: t.pop("blocks.0.mlp.fc2.weight")
    )
    assert_refused(
        folder, CheckpointError, "lacks tensor 'blocks.0.mlp.fc2.weight'", tmp_path
    )


def test_missing_tensors_are_refused(tmp_path):
    folder = edited_safetensors(tmp_path, lambda t: t.pop("blocks.1.norm2.bias"))
    assert_refused(
        folder,
        CheckpointError,
        r"missing tensor\(s\) \['blocks.1.norm2.bias'\] for block_1/norm2/beta",
        tmp_path,
    )


def test_truncated_files_are_refused(tmp_path):
    for name, file, match in (
        ("timm_vit_avg", "model.safetensors", "is truncated: its header describes"),
        (
            "augreg_vit",
            "model.npz",
            r"not a readable \.npz file \(truncated or corrupt\)",
        ),
    ):
        folder = copy_fixture(name, tmp_path)
        data = (folder / file).read_bytes()
        (folder / file).write_bytes(data[: len(data) // 2])
        assert_refused(folder / file, CheckpointError, match, tmp_path)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    assert_refused(garbage, CheckpointError, "bad or truncated header", tmp_path)


def test_npz_with_object_arrays_is_refused(tmp_path):
    path = tmp_path / "objects.npz"
    np.savez(path, meta=np.array([{"a": 1}], dtype=object))
    assert_refused(path, CheckpointError, "object arrays, which need pickle", tmp_path)


def torch_zip_bytes():
    """The layout of `torch.save`'s zip format (a pickle inside), made here
    without torch. The entries carry a fixed date so the bytes are the same in
    every process (pytest-xdist workers must collect identical test cases)."""
    import io

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in (
            ("archive/data.pkl", b"\x80\x02}q\x00."),
            ("archive/version", b"3\n"),
        ):
            archive.writestr(
                zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data
            )
    return buffer.getvalue()


@pytest.mark.parametrize(
    "filename,content",
    [
        ("pytorch_model.bin", torch_zip_bytes()),
        ("model.pt", b"\x80\x02}q\x00."),
        # A torch zip renamed to look safe is still recognised by content.
        ("model.safetensors", torch_zip_bytes()),
        ("weights.npz", torch_zip_bytes()),
    ],
    ids=["zip-bin", "bare-pickle-pt", "zip-as-safetensors", "zip-as-npz"],
)
def test_torch_pickles_are_refused_without_being_opened(tmp_path, filename, content):
    path = tmp_path / filename
    path.write_bytes(content)
    assert_refused(
        path, UnsafeCheckpointError, "is a PyTorch pickle checkpoint", tmp_path
    )
    folder = tmp_path / "repo"
    folder.mkdir(exist_ok=True)
    (folder / "pytorch_model.bin").write_bytes(content)
    assert_refused(
        folder, UnsafeCheckpointError, "unpickling runs arbitrary code", tmp_path
    )


def test_unrecognised_layout_and_bad_options(tmp_path):
    path = tmp_path / "other.safetensors"
    save_file({"conv.weight": np.zeros((2, 2), "float32")}, str(path))
    assert_refused(path, CheckpointError, "Unrecognised checkpoint layout", tmp_path)
    with pytest.raises(ValueError, match=r"Unknown options \['depth'\]; valid:"):
        convert_checkpoint(FIXTURES / "hf_vit", depth=3)
    with pytest.raises(ValueError, match="norm_groups= applies to hybrid"):
        convert_checkpoint(FIXTURES / "hf_vit", norm_groups=8)
    with pytest.raises(FileNotFoundError, match="not a local file or folder"):
        convert_checkpoint(tmp_path / "nowhere.safetensors")


def test_bfloat16_safetensors_are_read_exactly(tmp_path):
    values = np.array([1.0, -2.5, 0.15625, 3.0e38], "float32")
    words = (values.view(np.uint32) >> 16).astype("<u2")
    header = json.dumps(
        {"w": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}}
    ).encode()
    path = tmp_path / "bf16.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + words.tobytes())
    tensors, config = read_checkpoint(path)
    assert config == {}
    expected = (words.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(tensors["w"], expected)
    assert tensors["w"][0] == 1.0 and tensors["w"][1] == -2.5


# --- the Hub -----------------------------------------------------------------


# Shaped like huggingface_hub.errors (matched by class name, not imported).
EntryNotFoundError = type("EntryNotFoundError", (Exception,), {})
RemoteEntryNotFoundError = type(
    "RemoteEntryNotFoundError", (OSError, EntryNotFoundError), {}
)
LocalEntryNotFoundError = type(
    "LocalEntryNotFoundError", (FileNotFoundError, EntryNotFoundError), {}
)


def fake_hub(tmp_path, source_folder, blob_name=None, error=None):
    """A stand-in for huggingface_hub that serves files the way its cache
    does: a snapshot symlink onto a blob named after the file's sha256."""
    calls = []

    def hf_hub_download(repo_id, filename, revision=None):
        calls.append((repo_id, filename, revision))
        if error is not None:
            raise error
        source = source_folder / filename
        if not source.exists():
            raise RemoteEntryNotFoundError(filename)
        blobs = tmp_path / "cache" / "blobs"
        blobs.mkdir(parents=True, exist_ok=True)
        blob = blobs / (blob_name or sha256(source))
        if filename == "config.json":
            blob = blobs / "0123456789abcdef0123456789abcdef01234567"
        shutil.copy(source, blob)
        snapshot = tmp_path / "cache" / "snapshots" / "main"
        snapshot.mkdir(parents=True, exist_ok=True)
        link = snapshot / filename
        if link.exists() or link.is_symlink():
            link.unlink()
        link.symlink_to(blob)
        return str(link)

    return types.SimpleNamespace(hf_hub_download=hf_hub_download), calls


def test_download_by_name_checks_sha256_and_converts(tmp_path, monkeypatch):
    hub, calls = fake_hub(tmp_path, FIXTURES / "hf_vit")
    monkeypatch.setattr(hub_module, "import_hub", lambda: hub)
    model = convert_checkpoint("hf-hub:someone/vit-tiny", revision="v1")
    check_parity(model, "hf_vit")
    assert calls == [
        ("someone/vit-tiny", "model.safetensors", "v1"),
        ("someone/vit-tiny", "config.json", "v1"),
        ("someone/vit-tiny", "preprocessor_config.json", "v1"),
    ]
    # timm's Hub ids carry a dotted tag; they are ids, not file names.
    hub, calls = fake_hub(tmp_path, FIXTURES / "timm_vit_avg")
    monkeypatch.setattr(hub_module, "import_hub", lambda: hub)
    model = convert_checkpoint("timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k")
    check_parity(model, "timm_vit_avg")
    assert calls[0] == (
        "timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k",
        "model.safetensors",
        None,
    )


def test_download_with_a_wrong_sha256_is_refused(tmp_path, monkeypatch):
    hub, _ = fake_hub(tmp_path, FIXTURES / "hf_vit", blob_name="f" * 64)
    monkeypatch.setattr(hub_module, "import_hub", lambda: hub)
    assert_refused(
        "someone/vit-tiny",
        CheckpointError,
        f"sha256 mismatch for 'model.safetensors' from 'someone/vit-tiny': "
        f"expected {'f' * 64}",
        tmp_path,
    )
    local = FIXTURES / "hf_vit" / "model.safetensors"
    assert_refused(local, CheckpointError, "sha256 mismatch", tmp_path, sha256="0" * 64)
    digest = sha256(local)
    assert convert_checkpoint(local, sha256=digest).output_shape == (None, 5)


def test_offline_and_missing_files_and_no_huggingface_hub(tmp_path, monkeypatch):
    offline = LocalEntryNotFoundError("no connection and not in the cache")
    hub, _ = fake_hub(tmp_path, FIXTURES / "hf_vit", error=offline)
    monkeypatch.setattr(hub_module, "import_hub", lambda: hub)
    assert_refused(
        "someone/vit-tiny",
        ConnectionError,
        "Cannot download someone/vit-tiny/model.safetensors .* not in the "
        "Hugging Face cache .* connect once",
        tmp_path,
    )
    hub, _ = fake_hub(tmp_path, FIXTURES / "hf_vit")
    monkeypatch.setattr(hub_module, "import_hub", lambda: hub)
    assert_refused(
        "someone/vit-tiny",
        CheckpointError,
        "has no 'model.npz'",
        tmp_path,
        filename="model.npz",
    )
    assert_refused(
        "someone/vit-tiny",
        UnsafeCheckpointError,
        "PyTorch pickle",
        tmp_path,
        filename="pytorch_model.bin",
    )
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    assert_refused("someone/vit-tiny", ImportError, r"keras-vit-tf\[hub\]", tmp_path)


# --- the package itself ---------------------------------------------------------


def test_the_package_never_unpickles():
    """No pickle-family import, no torch.load, and no np.load that allows
    pickles."""
    banned_modules = {
        "pickle",
        "cPickle",
        "_pickle",
        "dill",
        "joblib",
        "shelve",
        "torch",
    }
    for path in sorted((REPO / "keras_vit").rglob("*.py")):
        source = path.read_text()
        assert "torch.load" not in source, path
        assert "allow_pickle=True" not in source.replace(" ", ""), path
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                names = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                names = {(node.module or "").split(".")[0]}
            else:
                names = set()
            assert not names & banned_modules, (path, node.lineno, names)
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "load"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in ("np", "numpy")
            ):
                # numpy's default is allow_pickle=False; anything but that
                # default or a literal False is refused.
                flags = {k.arg: k.value for k in node.keywords}
                flag = flags.get("allow_pickle", ast.Constant(False))
                assert isinstance(flag, ast.Constant), (path, node.lineno)
                assert flag.value is False, (path, node.lineno)
