"""docker/Dockerfile cannot be built on a CPU runner: check it statically instead."""
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = (ROOT / "docker" / "Dockerfile").read_text()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _instructions(name):
    return [line.split(None, 1)[1] for line in DOCKERFILE.splitlines() if line.startswith(name + " ")]


def test_base_image_is_an_exact_ngc_pytorch_tag():
    (base,) = _instructions("FROM")
    assert re.fullmatch(r"nvcr\.io/nvidia/pytorch:\d{2}\.\d{2}-py3", base), base  # never :latest


def test_pins_agree_with_pyproject():
    pins = dict(re.findall(r"([A-Za-z0-9_.-]+)==([0-9][^\s;'\"]*)", " ".join(
        PYPROJECT["project"]["dependencies"] + sum(PYPROJECT["project"]["optional-dependencies"].values(), []))))
    assert pins.get("megatron-core"), "pyproject.toml no longer pins megatron-core"
    in_docker = dict(re.findall(r"([A-Za-z0-9_.-]+)==([0-9][^\s\\\\'\"]*)", DOCKERFILE))
    assert in_docker.get("megatron-core") == pins["megatron-core"]
    for name, version in in_docker.items():
        assert pins.get(name) == version, f"{name}=={version} in the Dockerfile, {pins.get(name)} in pyproject.toml"
    extras = re.search(r"-e '\.\[([a-z,]+)\]'", DOCKERFILE).group(1).split(",")
    assert set(extras) <= set(PYPROJECT["project"]["optional-dependencies"])
    assert "monitor" in extras and "nvitop" in PYPROJECT["project"]["optional-dependencies"]["monitor"]


def _docker_argv(tmp_path, target, **env):
    """What `make <target>` hands docker, from a fake docker on PATH that records its argv."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(f"#!/bin/sh\nprintf '%s\\0' \"$@\" > {tmp_path}/argv\n")
    (bin_dir / "docker").chmod(0o755)
    out = subprocess.run(["make", "-s", target], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PY": sys.executable, "PATH": f"{bin_dir}:{os.environ['PATH']}", **env})
    assert out.returncode == 0, out.stderr
    return (tmp_path / "argv").read_text().split("\0")[:-1]


def test_copied_paths_workdir_and_command_exist(tmp_path):
    for args in _instructions("COPY"):
        *sources, _dest = args.split()
        for src in sources:
            assert (ROOT / src).exists(), f"COPY {src}: not in the repo"
    (workdir,) = _instructions("WORKDIR")
    assert f"safe.directory {workdir}" in DOCKERFILE
    run = " ".join(_docker_argv(tmp_path, "docker-run")) + " "
    assert f"{ROOT}:{workdir} " in run, "make docker-run must mount the repo where the image installed it"
    for flag in ("--gpus all", "--ipc=host", "--shm-size=", "--ulimit memlock=-1", "--ulimit stack=67108864"):
        assert flag in run
    assert _instructions("CMD") == ['["bash"]']
    assert "bash-completion" in DOCKERFILE


def test_docker_build_uses_this_dockerfile(tmp_path):
    assert _docker_argv(tmp_path, "docker-build") == ["build", "-f", "docker/Dockerfile", "-t", "megalab", "."]
