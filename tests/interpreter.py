"""A warm Triton interpreter for the kernel tests (conftest.interpreted): one process per test worker imports
torch, Triton (with TRITON_INTERPRET=1, which Triton reads when it is imported) and Megatron once, and forks a
child for each call, which runs the call as `python -c CALL` would and exits. Each call still starts from a
process that has run nothing (a fork of one that only imported), its output and exit status its own; what
it no longer pays is the 5-6 s of imports.

    python tests/interpreter.py        (started by Warm below; requests on stdin, answers on the pipe)

A request is one JSON line {call, env, cwd, out, err, timeout}: the child takes ENV as its environment,
CWD as its directory, writes its stdout and stderr to the files OUT and ERR, and the answer is one line
{rc} (rc null: killed at the timeout).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# What the checks import that is slow to import; megalab's own modules are imported by each child.
PRELOAD = ("torch", "triton", "triton.language", "pytest", "megatron.core.models.gpt.gpt_model",
           "megatron.core.fusions.fused_bias_gelu", "megatron.core.fusions.fused_bias_dropout",
           "megatron.core.optimizer", "torch.distributed")


def _child(req: dict) -> None:
    """In the forked child: the call as `python -c` runs it (a traceback and exit status 1 for an exception)."""
    import traceback

    os.setsid()  # its own process group: a timeout kills whatever it started too
    os.environ.clear()
    os.environ.update(req["env"])
    os.chdir(req["cwd"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, req["out"]), (2, req["err"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_TRUNC), fd)
    sys.argv = ["-c"]
    sys.path[0] = ""  # as `python -c`: the working directory first
    rc = 0
    try:
        exec(compile(req["call"], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            rc = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            rc = 1
    except BaseException:  # noqa: BLE001  (as the interpreter would: print it and exit 1)
        traceback.print_exc()
        rc = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    os._exit(rc)


def _wait(pid: int, timeout: float) -> int | None:
    """PID's exit status, or None after killing its process group at TIMEOUT seconds."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            try:
                os.killpg(pid, 9)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            return None
        time.sleep(0.02)


def _builtins_listed_once() -> None:
    """Triton's interpreter patches the builtins of triton.language into every @triton.jit call it runs, each nested
    helper's call too, finding them by inspect.getmembers over each module every time: a fifth of an interpreted
    norm kernel's time. Here each module's builtins are listed once, at the first call (a kernel's launch, before
    anything is patched; the modules do not change), and each call still patches every one of them that is a
    builtin at that moment, as Triton does. Where Triton's interpreter has no such step (another version), it is
    left as it is."""
    import inspect

    try:
        from triton.runtime import interpreter

        patch_attr, is_builtin = interpreter._patch_attr, interpreter.tl.core.is_builtin
        interpreter._patch_builtin  # noqa: B018  (the step replaced below)
    except (ImportError, AttributeError):
        return
    listed: dict[int, list[str]] = {}

    def patch_builtin(pkg, builder, scope):
        names = listed.get(id(pkg))
        if names is None:
            names = listed[id(pkg)] = [name for name, member in inspect.getmembers(pkg) if is_builtin(member)]
        for name in names:
            member = getattr(pkg, name, None)
            if is_builtin(member):
                patch_attr(pkg, name, member, builder, scope)

    interpreter._patch_builtin = patch_builtin


def serve() -> None:
    answers = os.fdopen(os.dup(1), "w")  # the pipe back; nothing else may write to it
    os.dup2(2, 1)
    from megalab._compat import ensure_typing_override

    ensure_typing_override()  # before Megatron: it lets megatron-core import on Python 3.11
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    _builtins_listed_once()
    print(json.dumps({"ready": True}), file=answers, flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            answers.close()
            _child(req)
        print(json.dumps({"rc": _wait(pid, req["timeout"])}), file=answers, flush=True)


class Warm:
    """The client: a server started on the first call (with this process's environment of the moment, and
    TRITON_INTERPRET=1), then one fork per call."""

    def __init__(self, pythonpath: str):
        self.pythonpath, self.proc, self.log = pythonpath, None, None

    def _start(self) -> None:
        self.log = tempfile.TemporaryFile()
        env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=self.pythonpath)
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve())], env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log)
        self._answer()

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.log.seek(0)
            self.proc = None
            raise RuntimeError(f"the warm Triton interpreter died:\n{self.log.read().decode()[-3000:]}")
        return json.loads(line)

    def run(self, call: str, timeout: float) -> subprocess.CompletedProcess:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=self.pythonpath)
        with tempfile.TemporaryDirectory(prefix="interpreted-") as tmp:
            out, err = Path(tmp) / "out", Path(tmp) / "err"
            out.touch()
            err.touch()
            self.proc.stdin.write(json.dumps({"call": call, "env": env, "cwd": os.getcwd(), "out": str(out),
                                              "err": str(err), "timeout": timeout}) + "\n")
            self.proc.stdin.flush()
            rc = self._answer()["rc"]
            stdout, stderr = out.read_text(errors="replace"), err.read_text(errors="replace")
        argv = [sys.executable, "-c", call]
        if rc is None:
            raise subprocess.TimeoutExpired(argv, timeout, stdout, stderr)
        return subprocess.CompletedProcess(argv, rc, stdout, stderr)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


if __name__ == "__main__":
    serve()
