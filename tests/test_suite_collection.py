"""The suite itself must collect the same test cases in every process:
pytest-xdist compares the lists its workers collect and refuses to run when
they differ (a parameter made from the clock, a random value or an unordered
set gives each worker its own test ids)."""

import time

import pytest
from helpers import run_python


def collected_ids(seed):
    """Every test id of a plain collection in a fresh process; the hash seed
    differs per call so that set and dict order of strings shows up too."""
    result = run_python(
        """
        import sys, pytest
        sys.exit(pytest.main(["--collect-only", "-q", "-o", "addopts=",
                              "-p", "no:cacheprovider", "tests"]))
        """,
        env={"PYTHONHASHSEED": str(seed)},
        timeout=600,
    )
    return [line for line in result.stdout.splitlines() if "::" in line]


@pytest.mark.slow
def test_two_collections_give_the_same_test_ids():
    first = collected_ids(seed=1)
    # Zip entries store times in 2-second steps: wait past one so that bytes
    # stamped with the current time would differ between the collections.
    time.sleep(2.5)
    second = collected_ids(seed=2)
    assert len(first) > 1000  # the whole suite, not an import error's empty list
    changed = sorted(set(first) ^ set(second))
    assert not changed, "ids that differ between two collections:\n" + "\n".join(
        i[:200] for i in changed[:10]
    )
    # Ids are names, not data: printable and short enough to read in a report.
    odd = [i for i in first if not i.isprintable() or len(i) > 250]
    assert not odd, "\n".join(i[:200] for i in odd[:10])
