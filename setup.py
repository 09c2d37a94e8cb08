"""Install keras-vit. TensorFlow comes from an extra: `[cpu]` or `[gpu]`."""

from setuptools import find_packages, setup

TF_VERSION = "2.21.0"

setup(
    name="keras-vit",
    version="0.1.0",
    description="Vision Transformers for Keras 3 on TensorFlow.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["keras_vit", "keras_vit.*"]),
    install_requires=[
        # Keras < 3.13.2 has known safe_mode bypasses.
        "keras>=3.13.2",
        "numpy",
        "scikit-learn",
        "pillow",
    ],
    extras_require={
        # One of these two brings TensorFlow: the CPU wheel is a fraction of
        # the size, the GPU one pulls the CUDA libraries.
        # tensorflow-cpu does not bring TensorBoard; the trainer logs to it.
        "cpu": [f"tensorflow-cpu>={TF_VERSION}", "tensorboard"],
        "gpu": [f"tensorflow[and-cuda]>={TF_VERSION}", "tensorboard"],
        "export": ["ai-edge-litert"],
        "viz": ["matplotlib"],
        "weights": ["safetensors"],
        "hub": ["huggingface_hub", "safetensors"],
        "test": [
            "pytest",
            "pytest-xdist",
            "ai-edge-litert",
            "matplotlib",
            "safetensors",
            "ruff",
        ],
    },
    entry_points={"console_scripts": ["keras-vit=keras_vit.cli:main"]},
)
