"""The package version, in one place: setup.py and export metadata read it."""

__version__ = "0.2.0"
