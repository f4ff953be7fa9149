"""The lever reference, docs/levers.md, and `make help FAST`: both written from the lever table
(megalab/runtime/levers.py), one row a lever. `python -m megalab levers` rewrites the page (--check: says whether it
is up to date); tests/test_levers.py holds the committed page to the table. Standard library only, as `make help`.
"""
from __future__ import annotations

from megalab.core.paths import ROOT
from megalab.runtime import levers

PAGE = ROOT / "docs" / "levers.md"
SOURCE = "megalab/runtime/levers.py"


def _where(lever: levers.Lever) -> str:
    return levers.RULES[lever.where].text if lever.where else "opt-in"


def _conditions(lever: levers.Lever) -> str:
    parts = []
    if lever.needs:
        parts.append(f"beside {', '.join(lever.needs)}")
    if lever.requires:
        parts.append(f"needs {', '.join(levers.REQUIREMENTS[r] for r in lever.requires)}")
    if lever.conflicts:
        parts.append(f"not with {', '.join(lever.conflicts)}")
    if lever.spec:
        parts.append("megalab's spec only")
    return "; ".join(parts)


def _link(where: str) -> str:
    path, _, anchor = where.partition("#")
    label = anchor.replace("-", " ") if anchor else path.rsplit("/", 1)[-1]
    return f"[{label}](../{where})"


def markdown() -> str:
    """docs/levers.md."""
    rows = [f"| `{lever.name}` | {_where(lever)} | {_conditions(lever)} | {lever.does} | "
            f"{', '.join(_link(w) for w in lever.evidence)} |" for lever in levers.TABLE]
    return "\n".join([
        "# Fast-path levers",
        "",
        f"Generated from [{SOURCE}](../{SOURCE}) by `.venv/bin/python -m megalab levers`; `make help FAST` prints it in the "
        "terminal.",
        "",
        "Without Transformer Engine or apex, Megatron-Core falls back on plain PyTorch for the optimizer, the "
        "gradient clip, the norms and several fused kernels. Each lever replaces one of those fallbacks with a "
        "faster stand-in that computes the same function (its test says so). `FAST` names the levers of a run: "
        "unset, the default below; `none`; `all`; or a comma-separated list. A lever is on by default where it "
        "paid on the benchmark and was slower nowhere it was tried (its evidence). With Transformer Engine a run "
        "has no levers, and Megatron's stock local spec (`SPEC=local`) none by default.",
        "",
        "| lever | on by default for | conditions | what it does | evidence |",
        "| --- | --- | --- | --- | --- |",
        *rows,
        "",
        "## Retired levers",
        "",
        "Tried against the default, never paid, and deleted; their runs stay on the bench page, and `FAST` refuses "
        "their names.",
        "",
        "| lever | why it went | evidence |",
        "| --- | --- | --- |",
        *(f"| `{name}` | {why} | {_link(levers.TRIED)} |" for name, why in levers.RETIRED.items()),
        "",
    ])


def text() -> str:
    """`make help FAST`: the same table, a lever a line."""
    width = max(len(lever.name) for lever in levers.TABLE) + 2
    out = ["FAST: the fast-path levers of a run (unset: the default; none; all; or a comma-separated list).",
           f"The reference with each lever's evidence: {PAGE.relative_to(ROOT)}.", ""]
    for lever in levers.TABLE:
        cond = _conditions(lever)
        out.append(f"  {lever.name:<{width}}{lever.does}")
        out.append(f"  {'':<{width}}default: {_where(lever)}" + (f"; {cond}" if cond else ""))
    return "\n".join(out)


def add_arguments(p) -> None:
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if docs/levers.md is out of date")


def main(args) -> int:
    """`python -m megalab levers`: write docs/levers.md from the table (--check: only say whether it is current)."""
    want = markdown()
    current = PAGE.read_text(encoding="utf-8") if PAGE.exists() else None
    if current == want:
        print(f"{PAGE.relative_to(ROOT)} is up to date")
        return 0
    if args.check:
        print(f"{PAGE.relative_to(ROOT)} is out of date; fix: .venv/bin/python -m megalab levers")
        return 1
    PAGE.parent.mkdir(exist_ok=True)
    PAGE.write_text(want, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0
