"""The YAML configs in (configs/experiments/*.yaml, models.yaml, checks.yaml, bench.yaml): one loader.

PyYAML's safe loader takes two things a damaged or hostile file can use against its reader: a key given
twice in one mapping (the second silently wins: a preset defined twice is the last one, with no word), and
aliases that expand exponentially (nine lines of `&a [*b, *b, ...]` are a billion items once walked: the
"billion laughs"). A repeated key is refused here in one line naming the file and the line; so is a
document that expands to more than MAX_ITEMS items (aliases counted each time they are used: a config
is a few thousand), one nested too deeply, and anything the file door refuses (core/infile.py: a FIFO, a
directory, a file too large, bytes that are not UTF-8).
Each config's own model (catalog.ChapterFile, catalog.Preset, claims.Claim, benchruns.BenchConfig) then
types what was read.
"""
from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.resolver import Resolver

from megalab.core import infile
from megalab.core.infile import InputError
from megalab.core.paths import ROOT


MAX_ITEMS = 1_000_000


class _NoRepeatedKeys(SafeConstructor):
    """SafeConstructor that refuses a key given twice in one mapping."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    if key in seen:
                        raise yaml.MarkedYAMLError(None, None, f"key {key!r} given twice (line "
                                                   f"{seen[key].line + 1} and here)", key_node.start_mark)
                    seen[key] = key_node.start_mark
                except TypeError:  # an unhashable key: the constructor says so
                    pass
        return super().construct_mapping(node, deep)


if hasattr(yaml, "_yaml") and hasattr(yaml._yaml, "CParser"):
    class _Loader(yaml._yaml.CParser, Composer, _NoRepeatedKeys, Resolver):
        """libyaml's parser (every command reads the catalog: 7x faster than PyYAML's) under PyYAML's own
        composer: libyaml's composer recurses in C and crashes the process on a document nested some
        30,000 deep, where PyYAML's raises RecursionError."""

        def __init__(self, stream):
            yaml._yaml.CParser.__init__(self, stream)
            Composer.__init__(self)
            _NoRepeatedKeys.__init__(self)
            Resolver.__init__(self)

        get_single_node, compose_document = Composer.get_single_node, Composer.compose_document
        compose_node, check_node, get_node = Composer.compose_node, Composer.check_node, Composer.get_node
else:  # PyYAML without libyaml
    class _Loader(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser, Composer, _NoRepeatedKeys,
                  Resolver):
        def __init__(self, stream):
            yaml.reader.Reader.__init__(self, stream)
            yaml.scanner.Scanner.__init__(self)
            yaml.parser.Parser.__init__(self)
            Composer.__init__(self)
            _NoRepeatedKeys.__init__(self)
            Resolver.__init__(self)


def shown(path: Path) -> str:
    """PATH relative to the checkout where it is inside it."""
    p = Path(path)
    try:
        return str((p.parent.resolve() / p.name).relative_to(ROOT))
    except (ValueError, RuntimeError, OSError):  # outside the checkout; a link loop
        return str(p)


def load(path, fix: str = "fix the file") -> Any:
    """The data of a YAML config; InputError (one line: the file, the line, what is wrong, FIX)."""
    p = Path(path)
    try:
        text = infile.text(p, infile.CONFIG_LIMIT)
    except InputError as e:
        raise InputError(shown(p), f"unreadable ({e.reason})" if "unreadable" not in e.reason else e.reason,
                         fix) from None
    if (kept := _PARSED.get(text)) is not None:  # the same text parsed before in this process: a copy
        return pickle.loads(kept)
    try:
        data = yaml.load(text, Loader=_Loader)  # noqa: S506 (a safe constructor)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        what = " ".join(str(getattr(e, "problem", None) or e).split())
        raise InputError(shown(p), f"unreadable (not valid YAML: {where}{what})", fix) from None
    except RecursionError:
        raise InputError(shown(p), "unreadable (nested too deeply)", fix) from None
    if expanded(data) > MAX_ITEMS:
        raise InputError(shown(p), f"expands to more than {MAX_ITEMS:,} items (aliases used over and over)", fix)
    if len(_PARSED) >= 64:
        _PARSED.pop(next(iter(_PARSED)))
    _PARSED[text] = pickle.dumps(data, pickle.HIGHEST_PROTOCOL)
    return data


# Text -> its data, pickled, for texts that loaded cleanly: a process that reads the catalog again after its caches
# were cleared (the tests, the input audit) parses each unchanged file once, and each reader gets a copy of its own
# (unpickling plain YAML data is several times quicker than a deepcopy). Keyed by the whole text, so any change,
# and every error, is parsed (and refused) again.
_PARSED: dict[str, bytes] = {}


def expanded(data: Any) -> int:
    """How many items DATA has with every alias expanded, counted without expanding it (each shared list
    or mapping is sized once), stopping early past MAX_ITEMS."""
    sizes: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(data, False)]
    while stack:
        obj, children_done = stack.pop()
        if not isinstance(obj, (list, dict)) or id(obj) in sizes:
            continue
        kids = list(obj.values()) if isinstance(obj, dict) else obj
        if not children_done:
            stack.append((obj, True))
            stack.extend((k, False) for k in kids if isinstance(k, (list, dict)) and id(k) not in sizes)
            continue
        sizes[id(obj)] = min(MAX_ITEMS + 1, 1 + sum(sizes.get(id(k), 1) for k in kids))
    return sizes.get(id(data), 1)
