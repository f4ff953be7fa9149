"""provenance's inert changes: a change that only adds definitions, or only touches the lever table's fields no run
reads, leaves a record's code today's; any other change does not (code_state on a temporary git repository, a commit
against HEAD)."""
import subprocess

import pytest

from megalab.core import provenance

BASE = '''"""doc"""
import os

LIMIT = 4


def used(x):
    return x + LIMIT
'''
TABLE = '''L = Lever
TABLE = (
    L("a", "does a", "m:f", "every", needs=()),
    L("b", "does b", None, None, spec=True),
)
RULES = {"every": 1}
'''


def _repo(tmp_path, path, before, after):
    def git(*a):
        subprocess.run(["git", "-C", str(tmp_path), *a], check=True, capture_output=True)

    tmp_path.mkdir(parents=True, exist_ok=True)
    git("init", "-q")
    git("config", "user.email", "t@t"), git("config", "user.name", "t")
    f = tmp_path / path
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(before)
    git("add", "-A"), git("commit", "-qm", "one")
    first = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    f.write_text(after)
    git("add", "-A"), git("commit", "-qm", "two")
    state, _ = provenance.code_state(first, tmp_path)
    return state == provenance.CURRENT


@pytest.mark.parametrize("after,want", [
    (BASE.replace('"""doc"""', '"""a new docstring"""') + "\n\ndef new(y):\n    return y\n\n\nBLOCK = 8\n", True),
    (BASE.replace("LIMIT = 4\n", "LIMIT = 4\nSTEP = 2\n\n\ndef helper():\n    return STEP\n"), True),
    (BASE.replace("x + LIMIT", "x - LIMIT"), False),  # an old function changed
    (BASE + "\nos.environ['X'] = '1'\n", False),  # a statement that runs at import
    (BASE + "\nLIMIT = 5\n", False),  # an old name given again
    (BASE + "\n\n@staticmethod\ndef g():\n    pass\n", False),  # a decorator runs at import
    (BASE + "\nCACHE = dict()\n", False),  # a call at import
])
def test_only_added_definitions_are_inert(tmp_path, after, want):
    assert _repo(tmp_path, "megalab/runtime/m.py", BASE, after) is want


def test_a_levers_default_and_text_are_the_launchers_not_the_runs(tmp_path):
    path = provenance.LEVER_TABLE
    moved = (TABLE.replace('"b", "does b", None, None,', '"b", "does it better", None, "every",')
             .replace('{"every": 1}', '{"every": 2}').replace("spec=True)", "spec=True, estimated=False)"))
    assert _repo(tmp_path / "w", path, TABLE, moved) is True
    installed = TABLE.replace('"m:f"', '"m:g"')  # what a run installs: counts
    assert _repo(tmp_path / "i", path, TABLE, installed) is False
    assert _repo(tmp_path / "o", "megalab/runtime/m.py", TABLE, moved) is False  # only the lever table has the rule
