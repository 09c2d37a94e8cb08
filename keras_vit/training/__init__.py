"""Training: config and recipes, the trainer, tf.data pipelines and
sources, augmentation, checkpoints and resume, distribution strategies and
fine-tuning."""
