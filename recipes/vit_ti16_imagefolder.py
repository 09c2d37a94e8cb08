"""ViT-Ti/16 (DeiT-Ti) from scratch on an ImageNet-style image folder.

    keras-vit train vit_ti16_imagefolder --data.path /data/imagenet \\
        --strategy mirrored

`data.path` holds `train/<class>/*.jpg` and `val/<class>/*.jpg`. The
hyperparameters are DeiT's (Touvron et al. 2021, Table 9) at 300 epochs of
ImageNet-1k: AdamW, lr 5e-4 per 512 images scaled with the global batch,
weight decay 0.05, 5 warmup epochs then cosine, label smoothing 0.1,
stochastic depth 0.1, RandAugment (2 ops, magnitude 9/10), MixUp 0.8 /
CutMix 1.0, random resized crop + flip, eval at 224 from a 0.875 center crop;
bfloat16 and XLA. DeiT reports 72.2% top-1 on ImageNet val for this setup;
the run is ~375k steps at batch 1024 and has not been run here (its smoke mode
runs in the tests on a generated folder).
"""

from keras_vit.training.config import DataConfig, ModelConfig, OptimConfig, TrainConfig

IMAGENET_TRAIN_IMAGES = 1_281_167
BATCH_SIZE = 1024
STEPS_PER_EPOCH = IMAGENET_TRAIN_IMAGES // BATCH_SIZE  # 1251


def get_config() -> TrainConfig:
    return TrainConfig(
        name="vit_ti16_imagefolder",
        strategy="mirrored",
        # bfloat16 / XLA as this machine runs fastest (keras_vit.hardware).
        precision="auto",
        jit_compile="auto",
        batch_size=BATCH_SIZE,
        eval_batch_size=256,
        total_steps=300 * STEPS_PER_EPOCH,
        checkpoint_every=STEPS_PER_EPOCH,
        eval_every=10,
        export_name="vit_ti16",
        model=ModelConfig(variant="Ti/16", image_size=224, drop_path_rate=0.1),
        data=DataConfig(
            source="folder",
            path="",
            train_split="train",
            eval_split="val",
            num_channels=3,
            # ImageNet statistics, as DeiT normalises.
            mean=(0.485, 0.456, 0.406),
            std=(0.229, 0.224, 0.225),
            eval_crop=0.875,
            crop_scale_min=0.08,
            flip=True,
            randaugment_ops=2,
            randaugment_magnitude=0.9,
            mixup_alpha=0.8,
            cutmix_alpha=1.0,
        ),
        optim=OptimConfig(
            learning_rate=5e-4,
            lr_base_batch_size=512,
            warmup_steps=5 * STEPS_PER_EPOCH,
            end_lr_fraction=0.01,
            weight_decay=0.05,
            clipnorm=0.0,  # DeiT does not clip
            label_smoothing=0.1,
        ),
    )
