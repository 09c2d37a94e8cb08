"""Dotted-key overrides of a nested config dataclass, from the command line.

`optim.learning_rate` names the field `learning_rate` of the section
`optim`; a section is a field whose default is itself a dataclass. Strings
from the command line are parsed to the type of the value they replace.
Written over any such dataclass so that `config` can hold the dataclasses
and import this module, not the other way round.
"""

from __future__ import annotations

import ast
import dataclasses

# Keys that also take "auto" (resolved by keras_vit.hardware at train time).
AUTO_KEYS = ("precision", "jit_compile")
# Of those, the ones whose value is otherwise a bool: true / false parse as
# bools whether the recipe holds "auto" or a bool.
BOOL_AUTO_KEYS = ("jit_compile",)
# Fields that hold in-process data, not settings: no command line reaches them.
HIDDEN_FIELDS = ("arrays",)


def _sections(config_class) -> dict:
    """`{field name: dataclass}` for the fields that are sections."""
    return {
        f.name: f.default_factory
        for f in dataclasses.fields(config_class)
        if dataclasses.is_dataclass(f.default_factory)
    }


def dotted_fields(config_class) -> list[tuple[str, dataclasses.Field]]:
    """`(dotted key, field)` for every overridable field, top-level first."""
    sections = _sections(config_class)
    found = [
        (f.name, f) for f in dataclasses.fields(config_class) if f.name not in sections
    ]
    for section, cls in sections.items():
        found += [
            (f"{section}.{f.name}", f)
            for f in dataclasses.fields(cls)
            if f.name not in HIDDEN_FIELDS
        ]
    return found


def dotted_keys(config_class) -> list[str]:
    """Every key `replace_dotted` accepts for `config_class`, dotted."""
    return [key for key, _ in dotted_fields(config_class)]


def key_table(config) -> list[str]:
    """One line per key of the dataclass instance `config`: the key, its
    type and its value there (`optim.learning_rate  float  0.001`)."""
    rows = []
    for key, field in dotted_fields(type(config)):
        section, _, name = key.rpartition(".")
        value = getattr(getattr(config, section) if section else config, name)
        rows.append((key, str(field.type), repr(value)))
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    return [f"{k:<{widths[0]}}  {t:<{widths[1]}}  {v}" for k, t, v in rows]


def parse_value(key: str, text, default):
    """`text` parsed to the type of `default`; non-strings pass unchanged."""
    if not isinstance(text, str):
        return text
    if isinstance(default, bool) or key in BOOL_AUTO_KEYS:
        lowered = text.lower()
        if lowered == "auto" and key in AUTO_KEYS:
            return "auto"
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
        if key in AUTO_KEYS:
            return text  # the config's own check names what it accepts
        raise ValueError(f"{key} must be true or false, got {text!r}.")
    if isinstance(default, int | float | tuple):
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            raise ValueError(
                f"{key} must be a {type(default).__name__}, got {text!r}."
            ) from None
        if isinstance(default, tuple) and isinstance(value, list | tuple):
            return tuple(tuple(v) if isinstance(v, list) else v for v in value)
        if isinstance(default, tuple) and isinstance(value, int | float):
            return (value,)  # `--data.mean 0.5`: one value for every channel
        if isinstance(default, float) and isinstance(value, int):
            return float(value)
        return value
    return text


def replace_dotted(config, values: dict):
    """A copy of the dataclass `config` with dotted keys replaced; unknown
    keys raise a ValueError listing the valid ones."""
    sections = {name: getattr(config, name) for name in _sections(type(config))}
    top = {}
    valid = dotted_keys(type(config))
    for key, text in values.items():
        if key not in valid:
            raise ValueError(
                f"Unknown config key {key!r}; valid keys are: {', '.join(valid)}."
            )
        section, _, name = key.rpartition(".")
        target = sections[section] if section else config
        value = parse_value(key, text, getattr(target, name))
        if section:
            sections[section] = dataclasses.replace(sections[section], **{name: value})
        else:
            top[name] = value
    return dataclasses.replace(config, **top, **sections)


def parse_overrides(args: list[str]) -> dict:
    """`["--set", "a.b=1", "--optim.learning_rate", "3e-4", "--smoke"]` ->
    `{"a.b": "1", "optim.learning_rate": "3e-4", "smoke": "true"}`."""
    values, i = {}, 0
    while i < len(args):
        arg = args[i]
        if arg == "--set":
            if i + 1 == len(args) or "=" not in args[i + 1]:
                raise ValueError(
                    "--set needs key=value, e.g. --set optim.learning_rate=3e-4"
                )
            key, _, value = args[i + 1].partition("=")
            values[key] = value
            i += 2
        elif arg.startswith("--") and "=" in arg:
            key, _, value = arg[2:].partition("=")
            values[key] = value
            i += 1
        elif arg.startswith("--"):
            key = arg[2:]
            if i + 1 < len(args) and not args[i + 1].startswith("--"):
                values[key] = args[i + 1]
                i += 2
            else:  # a bare flag: a boolean switched on
                values[key] = "true"
                i += 1
        else:
            raise ValueError(
                f"Unexpected argument {arg!r}; use --key value or --set key=value."
            )
    return values
