"""`make show-arguments` / `make count-arguments`: every Megatron flag of the installed version.

The list is Megatron's own argparse parser, built the way `parse_args` builds it
(`add_megatron_arguments`), so it is exactly what this megatron-core accepts, grouped as its
`--help` groups them. No GPU and no distributed set-up needed.

  python -m megalab arguments [PATTERN]    flags (optionally only those matching PATTERN), by group
  python -m megalab arguments --count      how many flags per group, and in all
"""
from __future__ import annotations

import argparse
import re
import sys

from megalab.harness.validate import megatron_available, parser


def groups(p: argparse.ArgumentParser) -> dict[str, list[argparse.Action]]:
    """Group title -> its flags (argparse's own -h left out), in Megatron's order."""
    out: dict[str, list[argparse.Action]] = {}
    for g in p._action_groups:  # argparse keeps groups only here; no public accessor
        acts = [a for a in g._group_actions if a.option_strings and not isinstance(a, argparse._HelpAction)]
        if acts:
            out.setdefault(g.title, []).extend(acts)
    return out


def _one_line(a: argparse.Action) -> str:
    flags = ", ".join(a.option_strings)
    default = "" if a.default in (None, False, argparse.SUPPRESS) else f"  [default: {a.default}]"
    text = " ".join((a.help or "").split())
    first = re.split(r"(?<=\.)\s", text, maxsplit=1)[0]
    return f"  {flags}{default}" + (f"\n      {first}" if first else "")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("pattern", nargs="?", metavar="PATTERN", help="only the flags matching this (a regex)")
    p.add_argument("--count", action="store_true", help="how many flags per group, and in all")


def main(args: argparse.Namespace) -> int:
    version = megatron_available()
    if version is None:
        print("megalab arguments: megatron-core is not installed; fix: make setup "
              "(or pip install --no-deps megatron-core==0.19.2)", file=sys.stderr)
        return 2
    grouped = groups(parser())
    if args.pattern:
        try:
            pat = re.compile(args.pattern, re.IGNORECASE)
        except re.error as e:
            print(f"megalab arguments: GREP={args.pattern!r} is not a regular expression ({e}); fix: e.g. GREP=ckpt "
                  "or GREP='tensor-model'", file=sys.stderr)
            return 2
        grouped = {t: [a for a in acts if any(pat.search(o) for o in a.option_strings)]
                   for t, acts in grouped.items()}
        grouped = {t: acts for t, acts in grouped.items() if acts}
    total = sum(len(acts) for acts in grouped.values())
    if args.count:
        width = max((len(t) for t in grouped), default=0)
        for title, acts in grouped.items():
            print(f"{title:<{width}}  {len(acts):4d}")
        print(f"{'total':<{width}}  {total:4d}  flags in megatron-core {version}")
        return 0
    for title, acts in grouped.items():
        print(f"## {title} ({len(acts)})")
        print("\n".join(_one_line(a) for a in acts))
        print()
    print(f"{total} flags in {len(grouped)} groups, megatron-core {version}")
    return 0
