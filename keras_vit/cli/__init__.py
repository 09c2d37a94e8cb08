"""The `keras-vit` command: one entry point for the package's jobs.

Each subcommand parses its arguments and makes one call into the package:

    train      keras_vit.training.trainer.train(recipe config)
    evaluate   keras_vit.analysis.evaluation.evaluate(model, held-out data)
    export     keras_vit.deploy.export.export_model(model, name, ...)
    predict    keras_vit.deploy.serving.predict(model path, images, top_k)
    convert    keras_vit.pretrained.convert.convert_checkpoint(checkpoint, out.keras)
    visualize  keras_vit.analysis.visualize attention maps / rollout PNGs
    bench      bench/throughput.py (source checkouts)
    info       model summary, parameter count and FLOPs

A user mistake (a missing file, a bad option or value) prints one line,
`keras-vit <command>: error: ...`, on stderr and exits with status 2;
`keras-vit --traceback <command> ...` shows the Python traceback instead.
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
# TensorFlow's log level is set by the package root (keras_vit.logs): by the
# time this module runs, TensorFlow is loaded.

from keras_vit.cli.common import UsageError  # noqa: E402
from keras_vit.cli.main import build_parser, main  # noqa: E402

__all__ = ["UsageError", "build_parser", "main"]
