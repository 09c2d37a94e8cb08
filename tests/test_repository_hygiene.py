"""What a published repository must not carry: paths of the machine it was
written on, and the numbers of the internal issues it was built from (a
reader outside the project cannot follow either)."""

import re
import subprocess

from helpers import REPO

# Spelled in pieces so that this file does not match itself.
MACHINE_PATH = re.compile(
    "(?<![\\w.~-])("
    + "|".join(
        [
            "/" + "root/",
            "/" + "home/[^/\\s]+/",
            "/" + "tmp/[\\w.-]+",
            "/" + "work/",
        ]
    )
    + ")"
)
ISSUE_NUMBER = re.compile(r"\bissues? \d+\b|(?<![\w/&])#\d+\b", re.IGNORECASE)


def tracked_text_files():
    """Every tracked text file (binary files hold no prose), fixtures aside:
    those are other projects' files, byte for byte."""
    names = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, names.split("\0")):
        if name.startswith("tests/fixtures/"):
            continue
        path = REPO / name
        if not path.is_file():  # deleted in the working tree, not yet committed
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue
        try:
            yield name, data.decode("utf-8")
        except UnicodeDecodeError:
            continue


def offending_lines(pattern, files):
    return [
        f"{name}:{number}: {line.strip()[:120]}"
        for name, text in files
        for number, line in enumerate(text.splitlines(), 1)
        if pattern.search(line)
    ]


def test_no_tracked_file_holds_a_machine_path():
    files = list(tracked_text_files())
    assert len(files) > 100  # the listing works: the package, tests, docs
    assert offending_lines(MACHINE_PATH, files) == []


def test_readme_and_docs_cite_no_internal_issue_numbers():
    files = [(n, t) for n, t in tracked_text_files() if n.endswith(".md")]
    assert "README.md" in dict(files)
    assert offending_lines(ISSUE_NUMBER, files) == []


def test_the_patterns_catch_what_they_are_for():
    for text in ("run_dir=/" + "tmp/run", "/" + "root/.cache", "in /" + "work/runs"):
        assert MACHINE_PATH.search(text), text
    for text in ("runs/digits/model.keras", "~/" + "tmp/x", "https://x.org/tmp/"):
        assert not MACHINE_PATH.search(text), text
    for text in ("see issue 12", "Issue 6 reckoned", "(#12)"):
        assert ISSUE_NUMBER.search(text), text
    for text in ("## 0.2.0", "tests 12", "https://github.com/a/b/issues/12"):
        assert not ISSUE_NUMBER.search(text), text


def test_every_benchmark_result_is_indexed():
    index = (REPO / "bench" / "results" / "README.md").read_text()
    for path in (REPO / "bench" / "results").rglob("*.json"):
        name = path.relative_to(REPO / "bench" / "results")
        # A folder of one run per seed is indexed as the folder.
        assert str(name) in index or f"{name.parent}/" in index, name
