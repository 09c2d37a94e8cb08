"""The package's own error types, shared by every subpackage.

Entry points (the CLI and the recipe scripts) turn these into one line naming
the file or key and exit status 2; anything else keeps its traceback.
"""


class CheckpointError(ValueError):
    """A checkpoint (a training checkpoint or a pretrained file) that cannot be
    read safely, is damaged, or does not fit the model."""


class UnsafeCheckpointError(CheckpointError):
    """A PyTorch pickle (`.bin`, `.pt`, a torch zip): refused, not read."""


class RunFolderError(ValueError):
    """A run folder that cannot be used as asked: locked by another trainer,
    holding a run of another config, or not writable."""


class ConfigChangedError(RunFolderError):
    """Resuming a run with settings that change its training trajectory."""


class RunLockedError(RunFolderError):
    """Another live process trains in the same run folder."""


class NonFiniteLossError(RuntimeError):
    """The loss (or a weight) became NaN or infinite; nothing was saved."""


__all__ = [
    "CheckpointError",
    "ConfigChangedError",
    "NonFiniteLossError",
    "RunFolderError",
    "RunLockedError",
    "UnsafeCheckpointError",
]
