"""An OUTDIR the launcher makes inside the repository is scratch: git does not see it.

`outdir/` is in .gitignore; a user's OUTDIR=runs2 is not, and its logs, checkpoints and memory CSVs
would show up in `git status` and ride along with a `git add .`. So the outermost folder the launcher
creates for an OUTDIR inside the repository goes into the clone's own .git/info/exclude (git's
untracked ignore list, never committed). Not a .gitignore inside OUTDIR: a copy of OUTDIR's contents
into results/runs (rsync -a) would carry it there and hide the records to commit. A folder that
already existed is the user's, and results/ is where records are committed: neither is touched.
"""
from __future__ import annotations

from pathlib import Path

from megalab.core import git
from megalab.core.paths import ROOT


def make_dir(path: Path, root: Path = ROOT) -> None:
    """mkdir -p `path`; the outermost folder this creates inside `root` (outside results/) is excluded
    from git."""
    path = Path(path).absolute()
    created = None
    for p in (path, *path.parents):
        if p.exists():
            break
        created = p
    path.mkdir(parents=True, exist_ok=True)
    if created is not None:
        exclude(created, root)


def exclude(folder: Path, root: Path = ROOT) -> bool:
    """Add `folder` (inside `root`, outside results/) to root's git exclude list unless git ignores it
    already; whether git now ignores it (False: outside, results/, no git, a name no pattern holds)."""
    try:
        rel = folder.resolve().relative_to(Path(root).resolve())
    except ValueError:
        return False
    if not rel.parts or rel.parts[0] == "results" or any(c in str(rel) for c in "\n\r"):
        return False
    ignored = git.run(root, "check-ignore", "-q", rel.as_posix() + "/")
    if ignored is None or ignored.returncode == 0:  # no git, or ignored already (outdir/)
        return ignored is not None
    out = git.run(root, "rev-parse", "--git-path", "info/exclude")
    if out is None or out.returncode:
        return False
    path = Path(out.stdout.strip())
    path = path if path.is_absolute() else Path(root) / path
    # one pattern, anchored at the top: the folder itself; git's pattern characters taken literally
    pattern = "/" + "".join("\\" + c if c in "\\*?[ !#" else c for c in rel.as_posix()) + "/"
    try:
        lines = path.read_text().splitlines() if path.exists() else []
        if pattern not in lines:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a") as f:
                f.write(("\n" if lines and not path.read_text().endswith("\n") else "")
                        + f"# megalab: an OUTDIR made inside the repository\n{pattern}\n")
    except OSError:
        return False
    return True
