"""keras_vit's recipes: one training config per file.

Each file defines `get_config()` returning a
`keras_vit.training.config.TrainConfig`; its docstring gives the command
that runs it and the result it reached. `keras-vit train NAME` runs one by
its file stem, `keras-vit train path/to/my_recipe.py` runs a file of the same
shape, and `keras-vit train NAME --keys` lists what can be overridden. The
folder ships in the wheel as `keras_vit/recipes/`.
"""
