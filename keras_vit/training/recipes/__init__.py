"""Recipes: named training configs that ship with the package.

Each module here defines `get_config()` returning a `TrainConfig`; its
docstring says the command that runs it and the result it reaches. A recipe
is named by its module name (`keras-vit train digits`) or given as a path to
a `.py` file of the same shape.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from pathlib import Path

from keras_vit.training.config import (
    TrainConfig,
    override,
    smoke_version,
    validate,
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


__all__ = ["base_recipe", "load_recipe", "recipe_names"]
