"""`make docker-run`: docker/Dockerfile's image with every GPU, the repo mounted over the image's copy
(edits and outdir/ stay on the host). The docker argv is built here, not by a shell, so DOCKER_ARGS
and DOCKER_CMD are split as shell word lists (shlex) and OUTDIR goes in as one item, whatever it holds.

--ipc=host shares the host's /dev/shm (NCCL, DataLoader workers; --shm-size is the limit instead with
DOCKER_ARGS=--ipc=private); pinned memory needs no memlock limit.
"""
from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

from megalab.core.paths import ROOT
from megalab.core.variables import LaunchError, value

WORKDIR = "/workspace/megalab"  # where docker/Dockerfile installs the repo


def argv(env=os.environ, tty: bool | None = None) -> list[str]:
    def words(name):
        try:
            return shlex.split(value(name, env))
        except ValueError as e:
            raise LaunchError(f"{name} is not a shell word list ({e}); fix: balance its quotes") from None

    tty = sys.stdin.isatty() if tty is None else tty
    out = env.get("OUTDIR", "")
    if out and ":" in str(Path(out).resolve()):  # -v splits at ':' (host:container:options)
        raise LaunchError(f"OUTDIR={out} holds a ':', which docker run -v reads as a separator; fix: OUTDIR=a path "
                          "without one")
    return ["docker", "run", "--rm", *(["-it"] if tty else []), "--gpus", "all", "--ipc=host",
            f"--shm-size={value('DOCKER_SHM', env)}", "--ulimit", "memlock=-1", "--ulimit", "stack=67108864",
            "-v", f"{ROOT}:{WORKDIR}",
            *(["-v", f"{Path(out).resolve()}:/outdir", "-e", "OUTDIR=/outdir"] if out else []),
            *words("DOCKER_ARGS"), value("DOCKER_IMAGE", env), *words("DOCKER_CMD")]


def cli(args: list[str]) -> int:
    cmd = argv()
    if shutil.which("docker") is None:
        raise LaunchError("docker not found; fix: install Docker and the NVIDIA Container Toolkit")
    if args[:1] == ["--print"]:
        print(shlex.join(cmd))
        return 0
    os.execvp("docker", cmd)
