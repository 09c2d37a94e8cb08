"""Finds, loads and shrinks recipes: the training configs in the top-level
`recipes/` folder (shipped in the wheel as `keras_vit/recipes/`).

A recipe is a `.py` file that defines `get_config()` returning a
`TrainConfig`; its docstring says the command that runs it and the result it
reaches. It is named by its file stem (`keras-vit train digits`) or given as
a path (`keras-vit train path/to/my_recipe.py`).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
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
        # Its own folder: a smoke run never holds (or blocks) the real run's.
        run_dir=config.run_dir or str(Path("runs") / f"{config.name}-smoke"),
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


def recipes_folder() -> Path:
    """The folder of the shipped recipes: `keras_vit/recipes/` in an
    installed wheel, the repository's `recipes/` in a source checkout."""
    package = Path(__file__).resolve().parents[1]
    for folder in (package / "recipes", package.parent / "recipes"):
        if (folder / "digits.py").is_file():
            return folder
    raise FileNotFoundError(
        f"no recipes folder beside {package}: reinstall keras-vit-tf "
        "(pip install keras-vit-tf[cpu], or pip install -e . in a checkout)"
    )


def recipe_names() -> list[str]:
    return sorted(
        path.stem
        for path in recipes_folder().glob("*.py")
        if not path.stem.startswith("_")
    )


def recipe_path(name_or_path: str) -> Path:
    """The file of recipe `name_or_path`: a shipped recipe's name or a path to
    a `.py` file that defines `get_config()` (checked without running it)."""
    path = Path(name_or_path)
    if path.suffix != ".py":
        if name_or_path in recipe_names():
            return recipes_folder() / f"{name_or_path}.py"
        raise ValueError(
            f"No recipe {name_or_path!r}; valid recipes are {recipe_names()} "
            "(or a path to a .py config file)."
        )
    if not path.is_file():
        raise ValueError(f"Recipe file {str(path)!r} does not exist.")
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    except (SyntaxError, UnicodeDecodeError) as error:
        raise ValueError(
            f"Recipe file {str(path)!r} is not valid Python: {error}"
        ) from None
    defines = {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    if "get_config" not in defines:
        raise ValueError(
            f"{str(path)!r} is not a recipe: a recipe defines get_config() "
            "returning a TrainConfig (see the files in keras-vit's recipes/)."
        )
    return path


def base_recipe(name_or_path: str) -> TrainConfig:
    """`get_config()` of a recipe, as it is: for recipes built on others."""
    path = recipe_path(name_or_path)
    spec = importlib.util.spec_from_file_location(f"keras_vit_recipe_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    if not isinstance(config, TrainConfig):
        raise ValueError(
            f"{str(path)!r}: get_config() returned {type(config).__name__}, "
            "not a TrainConfig."
        )
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
    "recipe_path",
    "recipes_folder",
    "keys_request",
    "load_recipe",
    "recipe_names",
    "smoke_version",
]
