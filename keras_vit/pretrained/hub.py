"""Checkpoints from the Hugging Face Hub, through `huggingface_hub` (the
`hub` extra): downloaded once into its cache (`HF_HUB_CACHE`, by default
`~/.cache/huggingface/hub`), read from there afterwards, also offline
(`HF_HUB_OFFLINE=1`, or when the network is missing)."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import warnings
from pathlib import Path

from keras_vit.errors import CheckpointError
from keras_vit.files import sha256 as file_sha256
from keras_vit.pretrained.readers import TORCH_SUFFIXES, refuse_torch

# The files beside a checkpoint that say its architecture and preprocessing.
CONFIG_FILES = ("config.json", "preprocessor_config.json")


class HubUnavailableError(ConnectionError):
    """The Hub cannot be reached (or offline mode is on) and the file is not
    in the local cache."""


def import_hub():
    try:
        import huggingface_hub
    except ImportError:
        raise ImportError(
            "Checkpoints by name need huggingface_hub: "
            'pip install "keras-vit-tf[hub]" (local checkpoint paths work '
            "without it)."
        ) from None
    return huggingface_hub


def _offline(hub) -> bool:
    constants = getattr(hub, "constants", None)
    flag = getattr(constants, "HF_HUB_OFFLINE", None)
    if flag is None:
        flag = os.environ.get("HF_HUB_OFFLINE", "").upper() in (
            "1",
            "ON",
            "YES",
            "TRUE",
        )
    return bool(flag)


def _cache_dir(hub) -> str:
    constants = getattr(hub, "constants", None)
    return str(getattr(constants, "HF_HUB_CACHE", "the Hugging Face cache"))


def _failure(hub, error: Exception, repo_id: str, filename: str) -> Exception:
    """The one-line error for a failed `hf_hub_download`."""
    # Matched by class name: huggingface_hub has renamed and re-parented
    # these across releases.
    kinds = {c.__name__ for c in type(error).__mro__}
    missing_locally = kinds & {"LocalEntryNotFoundError", "OfflineModeIsEnabled"}
    if not missing_locally and "EntryNotFoundError" in kinds:
        return CheckpointError(
            f"Hub repository {repo_id!r} has no {filename!r}. keras_vit reads "
            "safetensors or .npz files only (PyTorch .bin pickles are refused)."
        )
    if not missing_locally and "RepositoryNotFoundError" in kinds:
        return CheckpointError(
            f"No Hub repository {repo_id!r} (or it is private or gated: log in "
            "with `hf auth login`)."
        )
    where = f"{repo_id}/{filename}"
    if _offline(hub):
        return HubUnavailableError(
            f"{where} is not in the Hugging Face cache ({_cache_dir(hub)}) and "
            "HF_HUB_OFFLINE is set: unset it and connect once to download the "
            "file, or pass a local checkpoint path."
        )
    return HubUnavailableError(
        f"Cannot download {where} ({type(error).__name__}) and it is not in the "
        f"Hugging Face cache ({_cache_dir(hub)}): connect once to the Hub (the "
        "file is then cached for offline use), or pass a local checkpoint path."
    )


@contextlib.contextmanager
def _quiet():
    """huggingface_hub logs each retry of a request that fails (11 lines
    before keras_vit's own with no network, measured) and urllib3 each
    broken connection: the one error raised here says what failed and what
    to do, so theirs are held back while it downloads."""
    loggers = [logging.getLogger(name) for name in ("huggingface_hub", "urllib3")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def download_checkpoint(
    repo_id: str,
    filename: str = "model.safetensors",
    revision: str | None = None,
    sha256: str | None = None,
) -> Path:
    """Downloads `filename` (and the config files beside it) of a Hub
    repository into the Hugging Face cache, or finds it there, and checks
    the checkpoint's sha256.

    The expected digest is `sha256` when given, otherwise the Hub's own: the
    cache stores large (LFS) files under their sha256. Returns the local
    path of the checkpoint.
    """
    hub = import_hub()
    repo_id = repo_id.removeprefix("hf-hub:")
    if filename.endswith(TORCH_SUFFIXES):
        refuse_torch(Path(filename))
    with _quiet():
        try:
            local = Path(hub.hf_hub_download(repo_id, filename, revision=revision))
        except Exception as error:
            raise _failure(hub, error, repo_id, filename) from None
        for extra in CONFIG_FILES:
            try:
                hub.hf_hub_download(repo_id, extra, revision=revision)
            except Exception:
                pass  # timm .npz repos and others lack them; the tensors do.
    blob = local.resolve().name
    expected = sha256 or (blob if re.fullmatch(r"[0-9a-f]{64}", blob) else None)
    if expected is None:
        raise CheckpointError(
            f"Cannot verify {filename!r} from {repo_id!r}: the Hub gave no sha256 "
            "for it; pass sha256= with the digest you expect."
        )
    actual = file_sha256(local)
    if actual != expected.lower():
        raise CheckpointError(
            f"sha256 mismatch for {filename!r} from {repo_id!r}: expected "
            f"{expected}, the file has {actual}. Delete it from the Hugging Face "
            "cache and download again."
        )
    return local
