"""Megatron imported for its argument check (harness/validate.py) loads what the check calls, not all it could.

The first check in a process costs ~5 s of imports on two cores, most of it code the check never runs: the
fused functions Megatron compiles where their module is imported (jit_fuser is torch.compile: TorchDynamo and
Inductor, ~1.5 s) and every tokenizer library its tokenizer package imports up front (Hugging Face
transformers, ~1 s, for the NullTokenizer of a mock-data run). While this process first imports Megatron,
torch.compile leaves a function as it is (as torch.compile(disable=True) does, without importing Dynamo), and
the tokenizer libraries' package imports each library when its class is first asked for. The check's answer
is Megatron's own; a launch's ranks are processes of their own that import Megatron afresh.
"""
from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import types

# A package whose __init__ only imports names from its submodules, each imported when first asked for.
LAZY_PACKAGES = ("megatron.core.tokenizers.text.libraries",)


@contextlib.contextmanager
def for_the_check():
    """Around the imports of Megatron's check: only while Megatron is not imported yet in this process."""
    if "megatron.core" in sys.modules:
        yield
        return
    import torch

    compile_ = torch.compile

    def uncompiled(model=None, **options):
        return model if model is not None else (lambda fn: fn)

    for name in LAZY_PACKAGES:
        lazy_package(name)
    torch.compile = uncompiled
    try:
        yield
    finally:
        torch.compile = compile_


def _names(init: str, package: str) -> dict[str, str] | None:
    """name -> the submodule it comes from, where every statement of the package's __init__ is a docstring or
    `from <package>.<sub> import A, B` (relative too); else None (the package is imported as it is)."""
    names: dict[str, str] = {}
    for node in ast.parse(init).body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        if not isinstance(node, ast.ImportFrom) or any(a.name == "*" for a in node.names):
            return None
        module = (f"{package}.{node.module}" if node.module else package) if node.level == 1 else node.module
        if node.level > 1 or not module or not module.startswith(package + "."):
            return None
        names.update({a.asname or a.name: f"{module}:{a.name}" for a in node.names})
    return names


def _spec(package: str):
    """PACKAGE's spec, found below its top package's folders without importing its parents (find_spec would
    run their __init__ first: Megatron's, before torch.compile is set aside)."""
    top, *parts = package.split(".")
    spec = importlib.util.find_spec(top)  # a top-level name: nothing imported
    if spec is None or not spec.submodule_search_locations:
        return None
    folders = [os.path.join(location, *parts[:-1]) for location in spec.submodule_search_locations]
    return importlib.machinery.PathFinder.find_spec(package, folders) if parts else spec


def lazy_package(package: str) -> bool:
    """PACKAGE in sys.modules without running its __init__, its names imported from their submodules when
    first asked for (PEP 562). False where it is imported already, not found, or its __init__ does more."""
    if package in sys.modules:
        return False
    try:
        spec = _spec(package)
        init = spec.loader.get_source(package) if spec and spec.submodule_search_locations else None
        names = _names(init, package) if init is not None else None
    except (ImportError, ValueError, SyntaxError, AttributeError):
        return False
    if names is None:
        return False
    module = importlib.util.module_from_spec(spec)

    def __getattr__(name: str):
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        where, attr = names[name].split(":")
        value = getattr(importlib.import_module(where), attr)
        setattr(module, name, value)
        return value

    module.__getattr__ = __getattr__
    module.__dir__ = lambda: sorted(set(vars(module)) | set(names))
    sys.modules[package] = module
    return True
