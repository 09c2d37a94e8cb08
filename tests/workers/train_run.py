"""A resumable training run: `python train_run.py RUN_DIR --total-steps 30
--every 10`. Restarted with the same command, it resumes from its last
checkpoint. Writes RUN_DIR/steps.log (see common.StepLog)."""

import argparse
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from common import StepLog, compile_tiny, stream, tiny_vit  # noqa: E402

from keras_vit.training.checkpoints import CheckpointCallback, restore_latest  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("run_dir")
parser.add_argument("--total-steps", type=int, default=30)
parser.add_argument("--every", type=int, default=10)
parser.add_argument("--keep", type=int, default=3)
parser.add_argument("--sleep", type=float, default=0.0)
parser.add_argument("--nan-at", type=int, default=-1)
parser.add_argument("--dropout", type=float, default=0.1)
args = parser.parse_args()

model = compile_tiny(tiny_vit(args.dropout))
step = restore_latest(args.run_dir, model)
print(f"start_step {step}", flush=True)
os.makedirs(args.run_dir, exist_ok=True)
model.fit(
    stream(step, nan_at=args.nan_at),
    steps_per_epoch=args.every,
    epochs=args.total_steps // args.every,
    initial_epoch=step // args.every,
    verbose=0,
    callbacks=[
        StepLog(os.path.join(args.run_dir, "steps.log"), args.sleep),
        CheckpointCallback(args.run_dir, keep=args.keep),
    ],
)
print("finished", flush=True)
