"""One MultiWorkerMirroredStrategy worker (TF_CONFIG from the environment):
trains the tiny ViT on the shared deterministic stream, checkpoints into
RUN_DIR (chief only), saves its final weights to OUT.npz."""

import argparse
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402
from common import StepLog, compile_tiny, stream, tiny_vit  # noqa: E402

from keras_vit.training.checkpoints import CheckpointCallback  # noqa: E402
from keras_vit.training.distribute import get_strategy, is_chief  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("run_dir")
parser.add_argument("out")
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--jit", type=int, default=0)
parser.add_argument("--sleep", type=float, default=0.0)
parser.add_argument("--heartbeat", type=float, default=None)
args = parser.parse_args()

strategy = get_strategy("multiworker", heartbeat_timeout_seconds=args.heartbeat)
with strategy.scope():
    model = compile_tiny(tiny_vit(), strategy, jit_compile=bool(args.jit))
model.fit(
    stream(),
    steps_per_epoch=args.steps,
    epochs=args.epochs,
    verbose=0,
    callbacks=[
        StepLog(f"{args.out}.steps.log", args.sleep),
        CheckpointCallback(args.run_dir, keep=3),
    ],
)
np.savez(args.out, *[np.asarray(w) for w in model.get_weights()])
print(f"chief={is_chief(strategy)} xla={model.xla_mode}", flush=True)
