"""The package's own error types, shared by every subpackage.

Entry points (the CLI and the recipe scripts) turn these into one line naming
the file or key and exit status 2; anything else keeps its traceback.
"""


class CheckpointError(ValueError):
    """A checkpoint (a training checkpoint or a pretrained file) that cannot be
    read safely, is damaged, or does not fit the model."""


class UnsafeCheckpointError(CheckpointError):
    """A PyTorch pickle (`.bin`, `.pt`, a torch zip): refused, not read."""


__all__ = ["CheckpointError", "UnsafeCheckpointError"]
