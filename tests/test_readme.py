"""The README and the docs/ pages are run: every ```bash block from the
repository root and every ```python block as a script in a fresh process
(```console and other languages are shown, not run).

The two set-up commands at the top of the README are the exception: running
`pip install` and the whole test suite from inside the test suite would
recurse, and the main job is the training tests' job (and
tests/test_user_path.py runs it in a fresh venv). They are checked instead:
the test command is `.ci/test`, which `.ci/run` runs, the extras exist in setup.py, and
`keras-vit train digits` trains the default recipe and exports it.
"""

import ast
import dataclasses
import os
import re
import shlex
import subprocess
import sys

import pytest
from helpers import REPO
from PIL import Image

from keras_vit import parse_variant
from keras_vit.analysis import flops

README = REPO / "README.md"
# The guide and its reference pages, every block of each run the same way.
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.M | re.S)
SECTION = re.compile(r"^<!-- section: (\S+) -->", re.M)
RUN = ("bash", "python")
SHOWN = ("console", "text", "json", "yaml", "toml")


def page_blocks(page) -> list[tuple[str, str, str]]:
    """`(id, language, code)` for every fenced block of `page`, in order; the
    id names the page, the section and the block's number in it."""
    text = page.read_text(encoding="utf-8")
    sections = [(m.start(), m.group(1)) for m in SECTION.finditer(text)]
    blocks, counts = [], {}
    for match in FENCE.finditer(text):
        section = "top"
        for start, name in sections:
            if start < match.start():
                section = name
        counts[section] = counts.get(section, 0) + 1
        kind = match.group(1) or "bare"
        block_id = f"{page.stem}-{section}-{counts[section]}-{kind}"
        blocks.append((block_id, match.group(1).strip(), match.group(2)))
    return blocks


BLOCKS = [block for page in PAGES for block in page_blocks(page)]
SETUP = BLOCKS[0]
RUNNABLE = [b for b in BLOCKS[1:] if b[1] in RUN]


def test_every_block_is_run_or_marked_as_shown_only():
    for block_id, language, _ in BLOCKS:
        assert language in RUN + SHOWN, (
            f"block {block_id}: language {language!r} is neither run "
            f"({RUN}) nor shown-only ({SHOWN})"
        )


def script_commands(name: str) -> list[list[str]]:
    """The commands of a .ci script, words split, quiet flags dropped."""
    lines = (REPO / ".ci" / name).read_text().splitlines()
    skipped = ("#", "set ", "cd ")
    return [
        [word for word in shlex.split(line) if word not in ("-q", "--quiet")]
        for line in (raw.strip() for raw in lines)
        if line and not line.startswith(skipped)
    ]


def setup_extras() -> dict[str, list[str]]:
    tree = ast.parse((REPO / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "extras_require":
            return {
                key.value: [
                    item.value
                    for item in value.elts
                    if isinstance(item, ast.Constant)  # not the f-string pins
                ]
                for key, value in zip(node.value.keys, node.value.values, strict=True)
            }
    raise AssertionError("setup.py has no extras_require")


def test_setup_commands_are_the_ones_ci_and_the_recipe_use():
    block_id, language, code = SETUP
    assert (block_id, language) == ("README-top-1-bash", "bash")
    main_job, test_job = code.strip().splitlines()
    assert main_job == 'pip install -e ".[cpu,export]" && keras-vit train digits'
    # One script is the test command of the README and of CI: the same
    # installs, the same suite.
    assert test_job == "bash .ci/test"
    test_script = script_commands("test")
    assert test_script == [
        ["python", "-m", "pip", "install", "-e", ".[cpu,test]"],
        [
            "python", "-m", "pip", "install", "--no-deps",
            "tensorflow-serving-api", "mlxtend",
        ],
        ["python", "-m", "pytest", "$@"],
    ]  # fmt: skip
    ci = script_commands("run")
    assert ci[0] == ["bash", ".ci/test"]
    assert [c[:2] for c in ci[1:]] == [
        ["ruff", "check"],
        ["ruff", "format"],
        ["lint-imports"],
    ]
    extras = setup_extras()
    named = re.search(r'"\.\[([^\]]+)\]"', main_job).group(1).split(",")
    assert set(named) <= set(extras), (named, extras)
    assert {"cpu", "test"} <= set(extras)
    # The backend tests run on JAX's CPU build instead of skipping.
    assert "jax[cpu]" in extras["test"]


def test_keras_vit_train_digits_trains_and_exports_the_default_recipe(
    monkeypatch, capsys
):
    from keras_vit import cli
    from keras_vit.training import recipes
    from keras_vit.training import trainer as training

    seen = []

    def fake_train(config):
        seen.append(config)
        return {"name": config.name, "accuracy": 0.0, "run_dir": "runs/digits"}

    monkeypatch.setattr(training, "train", fake_train)
    assert cli.main(["train", "digits"]) == 0
    (config,) = seen
    # Only the progress display depends on whether stdout is a terminal.
    assert config.verbose in (1, 2)
    assert config == dataclasses.replace(
        recipes.load_recipe("digits"), verbose=config.verbose
    )
    assert config.data.source == "digits"
    assert config.export_name  # "... and exported for TF Serving and TFLite"
    assert "keras-vit evaluate runs/digits/model.keras" in capsys.readouterr().out


def test_readme_is_short_and_no_page_names_internal_paths_or_issues():
    text = README.read_text(encoding="utf-8")
    # A guide read in ten minutes; the reference lives in docs/.
    assert len(text.splitlines()) < 200
    for page in PAGES:
        body = page.read_text(encoding="utf-8")
        assert not re.search(r"(?<![\w.$])/(work|tmp|root|home)/", body), page.name
        assert not re.search(r"\bissue \d+|(?<![\w&])#\d{1,3}\b", body), page.name
        assert "recipes/train.py" not in body and "recipes/export.py" not in body
    for link in re.findall(r"\]\((docs/[^)#]+)\)", text):
        assert (REPO / link).is_file(), link


def section_text(name: str, page=REPO / "docs" / "models.md") -> str:
    text = page.read_text(encoding="utf-8")
    start = text.index(f"<!-- section: {name} -->")
    following = SECTION.search(text, start + 1)
    return text[start : following.start() if following else len(text)]


def variant_table() -> list[list[str]]:
    text = section_text("variants")
    rows = re.findall(r"^\| ((?:Ti|S|B|L|H)/\d+) \|(.*)\|\s*$", text, re.M)
    return [
        [variant, *(cell.strip() for cell in rest.split("|"))] for variant, rest in rows
    ]


def test_variant_table_matches_the_models():
    rows = variant_table()
    assert [r[0] for r in rows] == [
        "Ti/16",
        "S/16",
        "B/16",
        "B/32",
        "L/16",
        "L/32",
        "H/14",
    ]
    for variant, *cells in rows:
        arch = parse_variant(variant)
        assert [int(c) for c in cells[:4]] == [
            arch["hidden_dim"],
            arch["num_layers"],
            arch["num_heads"],
            arch["mlp_dim"],
        ], variant
        no_head = flops.vit_parameter_count(variant, 224, include_top=False)
        with_head = flops.vit_parameter_count(variant, 224, 1000)
        macs = flops.vit_macs(variant, 224, 1000)
        assert cells[4:] == [
            f"{no_head:,}",
            f"{with_head:,}",
            f"{macs / 1e9:.2f}",
            f"{2 * macs / 1e9:.2f}",
        ], variant
    # The analytic counts are the built model's (tests/test_cli.py checks
    # this for every option; here once at full size).
    import keras_vit

    model = keras_vit.ViT("Ti/16", 224, 1000)
    assert f"{model.count_params():,}" == rows[0][6]
    assert flops.count_macs(model) == flops.vit_macs("Ti/16", 224, 1000)


def test_pictures_exist_open_and_are_small():
    shown = 0
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for picture in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", text):
            path = page.parent / picture
            assert path.is_file(), (page.name, picture)
            assert path.stat().st_size < 200_000, (picture, path.stat().st_size)
            with Image.open(path) as image:
                image.load()
                assert image.format == "PNG"
            shown += 1
    assert shown, "no page shows a picture"


@pytest.mark.slow
@pytest.mark.parametrize("block", RUNNABLE, ids=[b[0] for b in RUNNABLE])
def test_readme_block_runs(block, tmp_path):
    block_id, language, code = block
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": "tensorflow"}
    if language == "bash":
        command = ["bash", "-euo", "pipefail", "-c", code]
    else:
        script = tmp_path / f"{block_id}.py"
        script.write_text(code)
        command = [sys.executable, str(script)]
    proc = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, (
        f"block {block_id} failed ({proc.returncode}):\n{code}\n"
        f"--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-3000:]}"
    )
