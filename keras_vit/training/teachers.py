"""Teachers are recipes: a distillation recipe names the recipe whose run
writes its `distill.teacher` (`distill.teacher_recipe`), and `prepare_teacher`
trains that recipe first when the file is missing and the user asked for it
(`keras-vit train RECIPE --train-teacher`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from keras_vit.training.config import TrainConfig
from keras_vit.training.distill import check_teacher


def _teacher_run_dir(config: TrainConfig) -> Path:
    """Where the teacher's run goes: the folder of `distill.teacher` (its run
    writes `model.keras` there); a smoke run's teacher goes inside the
    student's run folder, so that a two-step teacher never stands in for
    the real one."""
    if config.smoke:
        return Path(config.run_dir or Path("runs") / config.name) / "teacher"
    path = Path(config.distill.teacher)
    if path.name != "model.keras":
        raise ValueError(
            f"--train-teacher writes <run folder>/model.keras; distill.teacher "
            f"{str(path)!r} is not named model.keras."
        )
    return path.parent


def prepare_teacher(config: TrainConfig, train_missing: bool = False) -> TrainConfig:
    """`config` unchanged when its teacher exists (or it has none); else, with
    `train_missing`, trains `distill.teacher_recipe` (seed and smoke mode as
    the recipe and the student have them), prints what it did and returns
    `config` with `distill.teacher` at the new file (and `model.pretrained`,
    when the student starts from its teacher's weights: the same path);
    without it, a one-line ValueError naming the recipe that makes the
    teacher."""
    distill = config.distill
    if not distill.teacher or Path(distill.teacher).suffix != ".keras":
        return config
    if Path(distill.teacher).is_file():
        return config
    if not train_missing:
        check_teacher(config)
        return config
    if not distill.teacher_recipe:
        raise ValueError(
            f"--train-teacher needs distill.teacher_recipe, the recipe that "
            f"writes distill.teacher {distill.teacher!r}; none is set."
        )
    from keras_vit.training.recipes import load_recipe
    from keras_vit.training.trainer import train

    run_dir = _teacher_run_dir(config)
    overrides = {"run_dir": str(run_dir), "verbose": str(config.verbose)}
    if config.smoke:
        overrides["smoke"] = "true"
    teacher_config = load_recipe(distill.teacher_recipe, overrides)
    print(
        f"{config.name}: distill.teacher {distill.teacher!r} is missing; training "
        f"recipe {distill.teacher_recipe!r} into {run_dir} first"
    )
    metadata = train(teacher_config)
    path = Path(metadata["paths"]["model"])
    print(
        f"{config.name}: teacher {distill.teacher_recipe!r} trained: held-out "
        f"accuracy {metadata['accuracy']:.4f} after {metadata['steps']} steps, "
        f"{metadata['train_seconds']:.0f} s; distill.teacher = {path}"
    )
    model = config.model
    if model.pretrained == distill.teacher:
        model = dataclasses.replace(model, pretrained=str(path))
    return dataclasses.replace(
        config, model=model, distill=dataclasses.replace(distill, teacher=str(path))
    )
