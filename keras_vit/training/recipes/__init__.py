"""Recipes: named training configs that ship with the package.

Each module here defines `get_config()` returning a `TrainConfig`; its
docstring says the command that runs it and the result it reaches. A recipe
is named by its module name (`keras-vit train digits`) or given as a path to
a `.py` file of the same shape.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import pkgutil
from pathlib import Path

from keras_vit.training.config import TrainConfig, override, validate
from keras_vit.training.overrides import key_table, parse_overrides


def smoke_version(config: TrainConfig) -> TrainConfig:
    """The two-step version of a run: 2 steps, a checkpoint after each,
    evaluation capped at two batches, a resize (if any) after step 1, no
    export, at most 8 images a batch, images of at most ~32x32 and at most
    two transformer blocks (width and heads are kept)."""
    arch = config.model.architecture()
    patch = arch["patch_size"]

    def small(size):
        return size if size <= 32 else max(patch, 32 // patch * patch)

    resize = (
        ((1, small(config.model.resize_at[-1][1])),) if config.model.resize_at else ()
    )
    batch = min(config.batch_size, 8)
    return dataclasses.replace(
        config,
        smoke=True,
        total_steps=2,
        checkpoint_every=1,
        eval_every=0,
        batch_size=batch,
        eval_batch_size=min(config.eval_batch_size, 8),
        export_name="",
        model=dataclasses.replace(
            config.model,
            image_size=small(config.model.image_size),
            resize_at=resize,
            num_layers=min(arch["num_layers"], 2),
        ),
        optim=dataclasses.replace(
            config.optim,
            warmup_steps=min(config.optim.warmup_steps, 1),
            gradient_accumulation_steps=1,
        ),
    )


def recipe_names() -> list[str]:
    return sorted(
        info.name
        for info in pkgutil.iter_modules(__path__)
        if not info.name.startswith("_")
    )


def base_recipe(name_or_path: str) -> TrainConfig:
    """`get_config()` of a recipe, as it is: for recipes built on others."""
    path = Path(name_or_path)
    if path.suffix == ".py":
        if not path.is_file():
            raise ValueError(f"Recipe file {str(path)!r} does not exist.")
        spec = importlib.util.spec_from_file_location(
            f"keras_vit_recipe_{path.stem}", path
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    elif name_or_path in recipe_names():
        module = importlib.import_module(f"{__name__}.{name_or_path}")
    else:
        raise ValueError(
            f"No recipe {name_or_path!r}; valid recipes are {recipe_names()} "
            "(or a path to a .py config file)."
        )
    config = module.get_config()
    if not isinstance(config, TrainConfig):
        raise ValueError(f"{path}: get_config() must return a TrainConfig.")
    return config


def load_recipe(name_or_path: str, overrides: dict | None = None) -> TrainConfig:
    """`get_config()` of recipe `<name>` (or of a file path),
    with `overrides` applied and validated; `smoke=true` shrinks it."""
    config = override(base_recipe(name_or_path), **(overrides or {}))
    if config.smoke:
        config = smoke_version(config)
    return validate(config)


def keys_request(args: list[str]) -> list[str] | None:
    """For `[RECIPE] ... --keys ...` (the `--keys` anywhere): one line per
    config key with its type and its value in that recipe, the other
    overrides applied; None when `--keys` is not among `args`."""
    if "--keys" not in args:
        return None
    args = [a for a in args if a != "--keys"]
    recipe = "digits"
    if args and not args[0].startswith("--"):
        recipe, args = args[0], args[1:]
    return key_table(load_recipe(recipe, parse_overrides(args)))


__all__ = [
    "base_recipe",
    "keys_request",
    "load_recipe",
    "recipe_names",
    "smoke_version",
]
