"""Ask Megatron itself whether it accepts a command line, without GPUs.

`parse_and_validate_args` is the same code that runs at the start of training; with WORLD_SIZE
set it checks every divisibility and flag combination the real launch would. The model config
(`gpt_config_from_args`, TransformerConfig's checks) is built too, as the entry point does next. Running it before
a launch turns a 40-second start-up failure into an immediate one-line error.
"""
from __future__ import annotations

import argparse
import contextlib
import difflib
import functools
import hashlib
import io
import json
import logging
import os
import sys
import warnings
from pathlib import Path
from megalab._compat import ensure_typing_override
from megalab.core import infile, paths
from megalab.harness import checkimports


class MegatronRejected(ValueError):
    pass


class UnknownFlag(MegatronRejected):
    """A flag Megatron's parser does not know, with the closest one it does (None: nothing close)."""

    def __init__(self, flag: str, closest: str | None):
        super().__init__(f"{flag} is not a Megatron flag" + (f" (closest: {closest})" if closest else ""))
        self.flag, self.closest = flag, closest


def megatron_available() -> str | None:
    """The installed megatron-core version, or None (also when it cannot be imported here)."""
    try:
        import importlib.util
        from importlib.metadata import version

        if importlib.util.find_spec("megatron") is None:
            return None
        return version("megatron-core")
    except Exception:
        return None


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print 700 lines of usage and exit: one line instead
        raise MegatronRejected(message)


# Megatron writes its flags' help from its config dataclasses' source: ArgumentGroupFactory reads each class
# with inspect.getsource and walks its AST, nine tenths of building the parser, which a check builds twice
# (check_flags, then parse_args). A class's source does not change under a running process: each is read
# once per process, and the help text is the same.
_DOCSTRINGS: dict[type, dict[str, str]] = {}


@contextlib.contextmanager
def _docstrings_once():
    """While Megatron builds its parser: each config class's field docstrings read once per process."""
    try:
        from megatron.training.argument_utils import ArgumentGroupFactory

        read = ArgumentGroupFactory._get_field_docstrings
    except (ImportError, AttributeError):  # another megatron-core: its own way, unchanged
        yield
        return

    def once(self, cls):
        if cls not in _DOCSTRINGS:
            _DOCSTRINGS[cls] = read(self, cls)
        return dict(_DOCSTRINGS[cls])

    ArgumentGroupFactory._get_field_docstrings = once
    try:
        yield
    finally:
        ArgumentGroupFactory._get_field_docstrings = read


def parser() -> argparse.ArgumentParser:
    """Megatron's own argument parser, built as `parse_args` builds it (add_megatron_arguments): exactly
    the flags this megatron-core accepts. Its errors raise MegatronRejected (one line) instead of exiting."""
    ensure_typing_override()
    with warnings.catch_warnings(), checkimports.for_the_check():  # "TE/Apex not installed" notes are expected on CPU
        warnings.simplefilter("ignore")
        from megatron.training.arguments import add_megatron_arguments

        with _docstrings_once():
            return add_megatron_arguments(_Parser(description="Megatron-LM Arguments", allow_abbrev=False))


def check_flags(args: list[str], environ=os.environ) -> None:
    """Every item of `args` parses as Megatron's parser reads it: an unknown flag raises UnknownFlag
    (with the closest known one), a malformed value MegatronRejected, each in one line. Unknown flags
    are named first (a malformed value beside one is named once the flag is mended), from Megatron's
    flag table: kept in the machine's cache (flag_table), so that a flag Megatron does not know is
    refused without importing megatron.training (4 s)."""
    known, p = flag_table(environ), None
    if known is None:
        p = parser()
        known = table_of(p)
        if known is not None:
            save_flag_table(known, environ)
    flag = unknown_flag(args, known) if known is not None else None
    if flag is None:
        p = p or parser()
        _, unknown = p.parse_known_args(list(args))
        flags = [a.split("=", 1)[0] for a in unknown if a.startswith("--")]
        if not flags:
            if unknown:
                raise MegatronRejected(f"unrecognized arguments: {' '.join(unknown)}")
            return
        flag = flags[0]
    options = sorted(known if known is not None else table_of(p, remainder=True))
    raise UnknownFlag(flag, next(iter(difflib.get_close_matches(flag, options, n=1)), None))


def table_of(p: argparse.ArgumentParser, remainder: bool = False) -> frozenset[str] | None:
    """The parser's option strings (argparse keeps them only in its actions); None when an option takes
    the rest of the command line (nargs REMAINDER: then an unknown-looking item may be its value), unless
    `remainder`."""
    if not remainder and any(a.nargs in (argparse.REMAINDER, argparse.PARSER) for a in p._actions):
        return None
    return frozenset(o for a in p._actions for o in a.option_strings)


def unknown_flag(args: list[str], known: frozenset[str]) -> str | None:
    """The first item of `args` that Megatron's parser (allow_abbrev=False, no REMAINDER option) takes for
    an option it does not have: `--name` or `--name=value`, `--name` none of its option strings, before a
    bare `--`. Such an item is never an option's value, so argparse would report it among the unknown
    ones. None when there is none, or when an item starts with `--` and holds a space (argparse may
    take it for a value): the parser itself decides then."""
    first = None
    for a in args:
        if a == "--":
            break
        if a.startswith("--"):
            if " " in a:
                return None
            if first is None and a.split("=", 1)[0] not in known:
                first = a.split("=", 1)[0]
    return first


# ---- Megatron's flag table, once per install: the option strings of its parser, in the machine's cache under
# a key of everything they come from (the megatron-core and torch versions, the size and time of every file
# of the installed megatron package, this file and _compat.py). A table that is missing, damaged or of
# another key is made again from the parser; a cache that cannot be written costs the next check the import.

def flag_table_path(environ=os.environ) -> Path | None:
    key = _flag_table_key()
    return None if key is None else paths.cache_root(environ) / "megatron-flags" / f"{key}.json"


@functools.cache  # once per process: the megatron it imported is the one whose table it makes
def _flag_table_key() -> str | None:
    import importlib.util

    try:
        spec = importlib.util.find_spec("megatron")  # the top package only: nothing of it is imported
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    files = hashlib.sha256()
    for location in sorted(spec.submodule_search_locations):
        for folder, dirs, names in os.walk(location):
            dirs.sort()
            for name in sorted(names):
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    with contextlib.suppress(OSError):
                        st = os.stat(path)
                        files.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    code = hashlib.sha256()
    for f in ("megalab/harness/validate.py", "megalab/_compat.py"):
        with contextlib.suppress(OSError):
            code.update((Path(__file__).resolve().parent.parent.parent / f).read_bytes())
    material = {"megatron": _version("megatron-core"), "torch": _version("torch"), "python": sys.version,
                "files": files.hexdigest(), "code": code.hexdigest()}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def flag_table(environ=os.environ) -> frozenset[str] | None:
    """The option strings of Megatron's parser, from the cache; None when there is no good table for
    this install (then check_flags builds the parser, and saves the table)."""
    path = flag_table_path(environ)
    if path is None:
        return None
    try:
        doc = json.loads(infile.read(path, infile.CONFIG_LIMIT).decode("utf-8"))
    except (infile.InputError, ValueError):  # none yet, or damaged (ValueError: not UTF-8, not JSON)
        return None
    flags = doc.get("flags") if isinstance(doc, dict) and doc.get("key") == path.stem else None
    if not (isinstance(flags, list) and flags and all(isinstance(f, str) and f.startswith("-") for f in flags)):
        return None
    return frozenset(flags)


def save_flag_table(known: frozenset[str], environ=os.environ) -> None:
    path = flag_table_path(environ)
    if path is None:
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:  # a read-only home only costs the next check the import
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"key": path.stem, "flags": sorted(known)}) + "\n")
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()


def _version(pkg: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(pkg)
    except PackageNotFoundError:
        return None


def validate(args: list[str], world_size: int, device_arch: int = 9):
    """Run Megatron's argument validation (args: a plan's entry_args) for `world_size` ranks; return the args namespace.

    Raises MegatronRejected with Megatron's own message when it refuses the layout.
    Some checks depend on the GPU generation; without a GPU they are answered for `device_arch`
    (9 = Hopper, the H100/H200 the catalog is measured on).
    """
    check_flags(args)  # before Megatron's parse_args, which would print its whole usage for one bad flag
    with warnings.catch_warnings(), checkimports.for_the_check():  # "TE/Apex not installed" notes are expected here
        warnings.simplefilter("ignore")
        import megatron.training.arguments as margs
        from megatron.training.arguments import parse_and_validate_args
        from megatron.core.num_microbatches_calculator import destroy_num_microbatches_calculator
        from megatron.training import global_vars
        from megatron.training.global_vars import destroy_global_vars

    saved_argv = sys.argv
    saved_env = {k: os.environ.get(k) for k in ("WORLD_SIZE", "RANK", "CUDA_DEVICE_MAX_CONNECTIONS")}
    saved_arch = margs.get_device_arch_version
    # Checking flags must not open a TensorBoard event file or a wandb run (WANDB=1, PROFILE=1).
    saved_writers = global_vars._set_tensorboard_writer, global_vars._set_wandb_writer
    global_vars._set_tensorboard_writer = global_vars._set_wandb_writer = lambda args: None
    sys.argv = ["pretrain_gpt.py", *args]
    # the environment RUN_DIR/launch.sh gives every rank
    os.environ.update(WORLD_SIZE=str(world_size), RANK="0", CUDA_DEVICE_MAX_CONNECTIONS="1")
    if not _cuda_available():
        margs.get_device_arch_version = lambda: device_arch
    out = io.StringIO()
    quiet = logging.getLogger("megatron")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # its INFO lines (microbatches, vocab padding) go to stderr
    try:
        with contextlib.redirect_stdout(out), warnings.catch_warnings(), _docstrings_once():
            warnings.simplefilter("ignore")
            args = parse_and_validate_args()
            # The model config too: TransformerConfig's own checks (e.g. "apply_rope_fusion is not
            # available. Please install TE >= 1.4") run only when it is built, after the arg check.
            from megatron.training.argument_utils import gpt_config_from_args

            gpt_config_from_args(args)
            return args
    except SystemExit as e:  # argparse: unknown or malformed flag
        raise MegatronRejected(f"argparse exit {e.code}: {out.getvalue().strip()[-300:]}") from None
    except (AssertionError, ValueError, RuntimeError) as e:
        raise MegatronRejected(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__) from None
    finally:
        margs.get_device_arch_version = saved_arch
        global_vars._set_tensorboard_writer, global_vars._set_wandb_writer = saved_writers
        quiet.setLevel(level)
        destroy_global_vars()  # so the next validation starts from a clean slate
        destroy_num_microbatches_calculator()
        sys.argv = saved_argv
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ---- a verdict, once: Megatron's check costs a launch 4-10 s of imports (torch, megatron.training), which
# the worker pays again; an identical check that passed before passes again. The key is everything the
# verdict depends on: the flags, the world size, the versions of megatron-core and torch, the GPUs that
# answer the device checks, and the megalab files the check runs (this one, _compat.py, the layer spec).
_KEY_FILES = ("megalab/harness/validate.py", "megalab/_compat.py", "megalab/runtime/spec.py")


def cache_dir(environ=os.environ) -> Path:
    """`megatron-check` in the machine's cache (core/paths.cache_root)."""
    return paths.cache_root(environ) / "megatron-check"


# Flags (with their value) that name where a run logs rather than decide it: two launches of one plan,
# or a launch and its DRY_RUN, differ only there, so the key leaves them out (else every real launch
# missed the cache and paid Megatron's ~20 s import on the GPU host again).
_RUN_NAMING = ("--tensorboard-dir", "--wandb-save-dir", "--wandb-exp-name")


def _without_run_names(args: list[str]) -> list[str]:
    out, skip = [], False
    for a in map(str, args):
        if skip:
            skip = False
        elif a in _RUN_NAMING:
            skip = True
        else:
            out.append(a)
    return out


def verdict_key(args: list[str], world_size: int, gpu_names: list[str]) -> str:
    root = Path(__file__).resolve().parent.parent.parent
    code = hashlib.sha256()
    for f in _KEY_FILES:
        with contextlib.suppress(OSError):
            code.update((root / f).read_bytes())
    material = {"args": _without_run_names(list(args)), "world": world_size, "megatron": _version("megatron-core"),
                "torch": _version("torch"),
                "gpus": list(gpu_names), "code": code.hexdigest()}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def validate_cached(args: list[str], world_size: int, gpu_names: list[str], environ=os.environ) -> bool:
    """validate(), skipped when an identical check passed before. True when the verdict came from the
    cache. A rejection is never cached (it raises MegatronRejected every time). `gpu_names`: the GPUs
    found here (the launcher's inventory; [] without one), whose generation answers Megatron's device
    checks."""
    marker = cache_dir(environ) / verdict_key(args, world_size, gpu_names)
    if marker.exists():
        return True
    validate(args, world_size)
    with contextlib.suppress(OSError):  # a read-only home only costs the next launch the check again
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps({"args": list(args), "world": world_size}) + "\n")
    return False
