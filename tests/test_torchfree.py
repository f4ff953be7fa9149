"""The harness needs only the base dependencies: `list`, a dry run and `plan` work where torch,
tabulate and megatron cannot be imported (a CPU laptop, a login node)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Runs `python -m megalab ...` with an import hook that refuses the heavy packages, as if absent.
BLOCKED = r"""
import runpy, sys
BLOCKED = ("torch", "tabulate", "megatron", "transformer_engine")
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")
        return None
sys.meta_path.insert(0, Block())
sys.argv = ["megalab", *sys.argv[1:]]
runpy.run_module("megalab", run_name="__main__", alter_sys=True)
"""


def _megalab(tmp_path, *args, **env):
    return subprocess.run([sys.executable, "-c", BLOCKED, *args], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env})


@pytest.mark.parametrize("args,expect", [
    (["list"], "targets in"),
    (["run", "101-gpt2xl-dp1-gbs1-bf16"], "torchrun --standalone --local-addr localhost --nproc_per_node 1"),
    (["plan", "101-gpt2xl-dp1-gbs1-bf16"], "per GPU"),
    (["show-command", "101"], "--spec megalab.runtime.spec megalab_layer_spec"),
])
def test_runs_without_torch_tabulate_or_megatron(tmp_path, args, expect):
    out = _megalab(tmp_path, *args, DRY_RUN="1")
    assert out.returncode == 0, out.stderr
    assert expect in out.stdout and "Traceback" not in out.stderr
    if args[0] == "run":  # Megatron's own check is skipped in its one line
        assert "megatron   not installed here: Megatron's own argument check skipped" in out.stdout
    assert list(tmp_path.iterdir()) == []


def test_the_blocker_blocks(tmp_path):
    out = subprocess.run([sys.executable, "-c", BLOCKED.replace('runpy.run_module("megalab"', 'import torch  #'),
                          "x"], capture_output=True, text=True)
    assert out.returncode != 0 and "blocked by the test" in out.stderr
