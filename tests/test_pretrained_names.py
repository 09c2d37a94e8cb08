"""Named checkpoints: `keras_vit.from_pretrained(name)` and `keras-vit
convert NAME` with a short alias or a Hub id, downloaded once into a cache
laid out like Hugging Face's and read from it afterwards, also offline.
Nothing downloads: a stand-in for `huggingface_hub` serves the committed
fixtures as "the Hub" and keeps the cache the way the real one does
(`models--org--name/{blobs,refs,snapshots}`, blobs named by sha256)."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO, assert_parity, read_json

import keras_vit
from keras_vit.cli import main
from keras_vit.errors import CheckpointError
from keras_vit.pretrained import hub as hub_module
from keras_vit.pretrained import names
from keras_vit.pretrained.convert import HUB_PATTERN
from keras_vit.pretrained.metadata import timm_preprocessing

FIXTURES = REPO / "tests" / "fixtures"
COMMIT = "a" * 40
# Shaped like huggingface_hub.errors (matched by class name, not imported).
EntryNotFoundError = type("EntryNotFoundError", (Exception,), {})
LocalEntryNotFoundError = type(
    "LocalEntryNotFoundError", (FileNotFoundError, EntryNotFoundError), {}
)
RemoteEntryNotFoundError = type(
    "RemoteEntryNotFoundError", (OSError, EntryNotFoundError), {}
)


class FakeHub:
    """`hf_hub_download` over a local "Hub" (`remote`: repo id -> folder),
    caching into `cache` as huggingface_hub does; `network=False` and
    `constants.HF_HUB_OFFLINE` make it answer from the cache alone."""

    def __init__(self, cache: Path, remote: dict[str, Path], network=True):
        self.cache, self.remote, self.network = cache, remote, network
        self.constants = types.SimpleNamespace(
            HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE=False
        )
        self.fetched = []

    def _snapshot(self, repo_id: str) -> Path:
        return self.cache / f"models--{repo_id.replace('/', '--')}"

    def hf_hub_download(self, repo_id, filename, revision=None):
        root = self._snapshot(repo_id)
        ref = root / "refs" / (revision or "main")
        cached = root / "snapshots" / COMMIT / filename
        if ref.is_file() and cached.exists():
            if self.constants.HF_HUB_OFFLINE or not self.network:
                return str(cached)
        if not self.network and not self.constants.HF_HUB_OFFLINE:
            # huggingface_hub's backoff logs each retry (11 lines measured
            # with no network) before it gives up.
            for retry in range(1, 6):
                logging.getLogger("huggingface_hub.utils._http").warning(
                    f"Retrying in 1s [Retry {retry}/5]."
                )
        if self.constants.HF_HUB_OFFLINE or not self.network:
            raise LocalEntryNotFoundError(f"{repo_id}/{filename} not cached")
        source = self.remote[repo_id] / filename
        if not source.is_file():
            raise RemoteEntryNotFoundError(filename)
        self.fetched.append((repo_id, filename, revision))
        data = source.read_bytes()
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(COMMIT)
        cached.parent.mkdir(parents=True, exist_ok=True)
        if cached.is_symlink():
            cached.unlink()
        cached.symlink_to(Path("..") / ".." / "blobs" / blob.name)
        return str(cached)


@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    remote = {
        names.ALIASES["vit-ti16"].repo_id: FIXTURES / "timm_vit_avg",
        "google/vit-base-patch16-224": FIXTURES / "hf_vit",
    }
    hub = FakeHub(tmp_path / "hf-cache", remote)
    monkeypatch.setattr(hub_module, "import_hub", lambda: hub)
    return hub


def check_logits(model, fixture: str) -> None:
    parity = np.load(FIXTURES / fixture / "parity.npz")
    expected = parity["logits"]
    diff = np.max(np.abs(np.asarray(model(parity["images"])) - expected))
    # 1e-4 of the logits' scale, the converters' parity bound.
    assert diff < 1e-4 * np.max(np.abs(expected)), diff


def test_alias_downloads_once_then_works_offline_from_the_cache(fake_hub, tmp_path):
    out = tmp_path / "vit.keras"
    model = keras_vit.from_pretrained("ViT-Ti16", out)
    check_logits(model, "timm_vit_avg")
    repo = names.ALIASES["vit-ti16"].repo_id
    assert [f[:2] for f in fake_hub.fetched] == [
        (repo, "model.safetensors"),
        (repo, "config.json"),
    ]
    metadata = read_json(out.with_suffix("") / "metadata.json")
    assert metadata["source"] == {
        "checkpoint": "ViT-Ti16",
        "layout": "timm",
        "repo_id": repo,
    }
    # Offline: the same model from the cache, nothing fetched.
    fake_hub.fetched.clear()
    fake_hub.constants.HF_HUB_OFFLINE = True
    check_logits(keras_vit.from_pretrained("vit-ti16"), "timm_vit_avg")
    fake_hub.constants.HF_HUB_OFFLINE = False
    fake_hub.network = False
    check_logits(keras_vit.from_pretrained(repo), "timm_vit_avg")
    assert fake_hub.fetched == []


def test_hub_ids_of_both_ecosystems(fake_hub):
    model = keras_vit.from_pretrained("google/vit-base-patch16-224")
    check_logits(model, "hf_vit")
    # The fixture has no preprocessor_config.json, which is then skipped.
    assert [f[1] for f in fake_hub.fetched] == ["model.safetensors", "config.json"]
    # The alias of the same repository reads the cache: no second download.
    fake_hub.fetched.clear()
    fake_hub.network = False
    check_logits(keras_vit.from_pretrained("hf-vit-b16"), "hf_vit")


def test_missing_network_or_cache_says_what_to_do_in_one_line(fake_hub, caplog):
    fake_hub.network = False
    with pytest.raises(hub_module.HubUnavailableError) as error:
        keras_vit.from_pretrained("vit-ti16")
    # No retry lines of huggingface_hub's before keras_vit's one line.
    assert not [r for r in caplog.records if r.name.startswith("huggingface_hub")]
    message = str(error.value)
    assert "\n" not in message
    assert re.search(
        r"Cannot download timm/vit_tiny_patch16_224\.augreg_in21k_ft_in1k/"
        r"model\.safetensors .* not in the Hugging Face cache \(.*hf-cache\): "
        "connect once",
        message,
    )
    fake_hub.network = True
    fake_hub.constants.HF_HUB_OFFLINE = True
    with pytest.raises(hub_module.HubUnavailableError, match="HF_HUB_OFFLINE is set"):
        keras_vit.from_pretrained("vit-ti16")


def test_a_pinned_sha256_that_does_not_match_is_refused(fake_hub, monkeypatch):
    entry = names.ALIASES["vit-ti16"]
    pinned = names.NamedCheckpoint(**{**entry.__dict__, "sha256": "0" * 64})
    monkeypatch.setitem(names.ALIASES, "vit-ti16", pinned)
    with pytest.raises(CheckpointError, match="sha256 mismatch .* expected 0000"):
        keras_vit.from_pretrained("vit-ti16")
    digest = hashlib.sha256(
        (FIXTURES / "timm_vit_avg" / "model.safetensors").read_bytes()
    ).hexdigest()
    good = names.NamedCheckpoint(**{**entry.__dict__, "sha256": digest})
    monkeypatch.setitem(names.ALIASES, "vit-ti16", good)
    check_logits(keras_vit.from_pretrained("vit-ti16"), "timm_vit_avg")


def test_cli_converts_a_name_and_reports_missing_pieces_in_one_line(
    fake_hub, tmp_path, monkeypatch, capsys
):
    out = tmp_path / "named.keras"
    assert main(["convert", "vit-ti16", str(out)]) == 0
    assert out.is_file()
    assert "wrote" in capsys.readouterr().out
    fake_hub.network = False
    assert main(["convert", "dinov2-s14", str(tmp_path / "x.keras")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "connect once" in err, err
    monkeypatch.undo()  # the real import_hub, which finds no huggingface_hub
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    assert main(["convert", "vit-ti16", str(tmp_path / "y.keras")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "keras-vit-tf[hub]" in err, err
    assert not (tmp_path / "x.keras").exists() and not (tmp_path / "y.keras").exists()


def test_the_alias_table_is_well_formed():
    for name, entry in names.ALIASES.items():
        assert name == name.lower() and names.lookup(name.upper()) is entry
        assert HUB_PATTERN.match(entry.repo_id), name
        assert entry.filename.endswith((".safetensors", ".npz")), name
        assert entry.sha256 is None or re.fullmatch(r"[0-9a-f]{64}", entry.sha256)
        if entry.preprocessing is not None:
            preprocessing = timm_preprocessing(names.alias_preprocessing(entry))
            assert (
                len(preprocessing["mean"]) == 3
                and 0 < preprocessing["crop_fraction"] <= 1
            )
    assert names.lookup("no-such-model") is None
    with pytest.raises(FileNotFoundError, match="nor a short name such as 'vit-b16'"):
        keras_vit.from_pretrained("no-such-model")


def test_the_tables_preprocessing_fills_in_when_the_config_has_none(fake_hub, tmp_path):
    remote = tmp_path / "remote"
    remote.mkdir()
    source = FIXTURES / "timm_vit_avg"
    (remote / "model.safetensors").write_bytes(
        (source / "model.safetensors").read_bytes()
    )
    config = read_json(source / "config.json")
    assert config.pop("pretrained_cfg")["mean"] == [0.5, 0.5, 0.5]
    (remote / "config.json").write_text(json.dumps(config))
    entry = names.ALIASES["deit-s16"]
    fake_hub.remote[entry.repo_id] = remote
    out = tmp_path / "deit.keras"
    keras_vit.from_pretrained("deit-s16", out)
    preprocessing = read_json(out.with_suffix("") / "metadata.json")["preprocessing"]
    # The table's ImageNet statistics and crop, not the fixture's own.
    np.testing.assert_allclose(preprocessing["mean"], entry.preprocessing["mean"])
    np.testing.assert_allclose(preprocessing["std"], entry.preprocessing["std"])
    assert preprocessing["crop_fraction"] == entry.preprocessing["crop_pct"]
    assert preprocessing["resize_method"] == "bicubic"


# One alias per transformers family, served by a fixture of the same class.
FAMILY_ALIASES = {
    "hf-dinov2-s14": "hf_family_dinov2",
    "hf-dinov2-s14-reg": "hf_family_dinov2_reg",
    "hf-dinov3-s16": "hf_family_dinov3",
    "hf-siglip-b16": "hf_family_siglip_model",
    "hf-clip-b32": "hf_family_clip_model",
}


@pytest.mark.parametrize(("alias", "fixture"), sorted(FAMILY_ALIASES.items()))
def test_a_transformers_family_alias_converts_and_works_offline(
    alias, fixture, fake_hub, tmp_path
):
    entry = names.ALIASES[alias]
    fake_hub.remote[entry.repo_id] = FIXTURES / fixture
    out = tmp_path / "named.keras"
    model = keras_vit.from_pretrained(alias, out)
    parity = np.load(FIXTURES / fixture / "parity.npz")
    expected = parity["logits_32x32"]
    # 1e-4 of max(1, |outputs|), the converters' parity bound.
    assert_parity(model(parity["images_32x32"]), expected, expected, 1e-4, alias)
    metadata = read_json(out.with_suffix("") / "metadata.json")
    assert metadata["source"]["repo_id"] == entry.repo_id
    # The fixture has no preprocessor_config.json: the table's copy of the
    # repository's processor fills in.
    preprocessing = metadata["preprocessing"]
    np.testing.assert_allclose(preprocessing["mean"], entry.preprocessing["mean"])
    np.testing.assert_allclose(preprocessing["std"], entry.preprocessing["std"])
    assert preprocessing["resize_method"] == entry.preprocessing["interpolation"]
    squash = entry.preprocessing.get("crop_mode") == "squash"
    assert preprocessing["keep_aspect_ratio"] is not squash
    fake_hub.fetched.clear()
    fake_hub.network = False
    assert_parity(
        keras_vit.from_pretrained(alias)(parity["images_32x32"]),
        expected,
        expected,
        1e-4,
        alias,
    )
    assert fake_hub.fetched == []
