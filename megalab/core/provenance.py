"""Was a record made by today's code with today's defaults? One verdict per record for the pages.

A row of a results page stands for what `make <target>` gives today. A record answers that only if

* its settings were the defaults: a schema-2 record (its `intent` is the resolved plan; a schema-1
  record has none, so it cannot show what it ran with) whose fast-path levers are the spec's default
  (FAST unset), whose CUDA graph was the auto policy's (CUDA_GRAPH unset), with no EXTRA_ARGS beyond
  the catalog's and the default WARMUP (`warmup_iters`); and
* its code is today's: the record's `versions.megalab_commit` is HEAD or an ancestor of it, and no
  commit since touched what decides how a run runs (CODE_PATHS: the code inside torchrun, the run
  plan, the launcher script). Judged with git; where git or the commit is unavailable: unknown.
  A file only one feature's runs execute (FEATURE_FILES: context parallelism's attention, the MoE
  experts) counts only for the records of runs that used that feature. A change that cannot alter what
  ran does not count either (`inert_blobs`): one that only adds new functions, classes or constants beside
  unchanged ones (a run from before called none of them; a changed caller counts on its own), or, in the
  lever table, only fields no run reads (LAUNCHER_FIELDS: the settings check judges the default).

Verdicts: CURRENT, OLDER (other code or other defaults, with the reason), UNKNOWN (git cannot say).
"""
from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path

from megalab.core.paths import ROOT
from megalab.core import git
from megalab.core import records as _records
from megalab.core.records import RunRecord, settings
from megalab.core.schema import Config
from megalab.core import catalog, plan, ports
from megalab.runtime import levers
from megalab.core.catalog import CatalogError
from megalab.core.variables import LaunchError, Options

CURRENT, OLDER, UNKNOWN = "current", "older", "unknown"
# The code inside torchrun: a net change to it since a record's commit makes the record "other code".
# The launcher's side is judged by what it does, not by its files: the record's target is planned again
# and its Megatron argv compared (replan_differs).
CODE_PATHS = ("megalab/runtime",)
# Files inside CODE_PATHS that only one feature's runs execute: a change there leaves every other run's
# code as it was (the spec imports them, but calls them only for that feature). Keyed by file, the value
# says whether a record's run used it, from its config.
FEATURE_FILES = {
    "megalab/runtime/cp_attention.py": lambda cfg: (cfg.cp or 1) > 1,
    "megalab/runtime/grouped_experts.py": lambda cfg: bool(cfg.num_experts),
    "megalab/runtime/moe_dispatch.py": lambda cfg: bool(cfg.num_experts),
    "megalab/runtime/moe_act.py": lambda cfg: bool(cfg.num_experts),
    "megalab/runtime/norm.py": lambda cfg: _asks(cfg, "compiled_norm"),  # retired levers' files (deleted)
    "megalab/runtime/zero_overlap.py": lambda cfg: _asks(cfg, "zero_overlap"),
    "megalab/runtime/liger_norm.py": lambda cfg: _asks(cfg, levers.LIGER_NORM),
    "megalab/runtime/triton_norm.py": lambda cfg: _asks(cfg, levers.TRITON_NORM),
    "megalab/runtime/bias_gelu.py": lambda cfg: _asks(cfg, levers.BIAS_GELU),
    "megalab/runtime/dropout_add.py": lambda cfg: _asks(cfg, levers.DROPOUT_ADD),
    "megalab/runtime/qkv_split.py": lambda cfg: _asks(cfg, levers.QKV_PACK),
    "megalab/runtime/gelu_epilogue.py": lambda cfg: _asks(cfg, levers.GELU_EPILOGUE),
}


def _asks(cfg: Config, lever: str) -> bool:
    """Whether a record's fast path named LEVER (a name is matched whole); FAST=all named every lever of its day,
    a retired one's too."""
    fast = cfg.fastpath or ()
    return lever in fast or getattr(fast, "written", None) == "all"


DEFAULT_WARMUP = 3  # megalab/core/variables.py WARMUP's default (tests keep the two equal)

MARK = {CURRENT: "today", OLDER: "older", UNKNOWN: "unknown"}
CODE_CHANGED = "run code changed since"  # the start of the reason a record is older by its code alone
LEGEND = ("provenance: `today` = a schema-2 record run with today's defaults (FAST, CUDA_GRAPH, EXTRA_ARGS "
          "and WARMUP unset), whose target today's launcher plans to the same Megatron command (port and run "
          "dir aside), by the same code inside torchrun (git: no net change to " + ", ".join(CODE_PATHS)
          + " since its megalab_commit, context-parallel attention and MoE experts counting only for runs that "
          "use them, and a change that only adds definitions, or only the lever table's fields no run reads, "
          "not at all); `older (why)` = other code or other defaults, e.g. "
          "`schema 1`: a record from before runs kept their resolved plan; `unknown` = git cannot say. "
          "`STRICT=1 make tables` refuses pages with rows that are not `today`.")


@dataclasses.dataclass(frozen=True)
class Provenance:
    state: str  # CURRENT | OLDER | UNKNOWN
    why: str = ""  # short reason for OLDER / UNKNOWN

    @property
    def cell(self) -> str:
        return MARK[self.state] + (f" ({self.why})" if self.why else "")


def default_fastpath(rec: RunRecord) -> tuple[str, ...]:
    """The fast path a plain `make <target>` resolves for this record's target and implementation."""
    cfg = rec.config
    if cfg.transformer_impl == "transformer_engine":
        return ()
    spec = (rec.intent.spec if rec.intent else None) or cfg.spec or "megalab"
    if spec != "megalab":
        return ()
    return levers.default(cfg.num_experts, cfg.model_preset or {})


def settings_differ(rec: RunRecord) -> str:
    """'' when the record ran with today's defaults, else a short reason (the first difference)."""
    if rec.schema < 2 or rec.intent is None:
        return "schema 1"
    intent, cfg = rec.intent, rec.config
    fast = intent.fastpath if "fastpath" in intent.model_fields_set else cfg.fastpath
    if fast != default_fastpath(rec):
        return f"FAST={fast if fast is None else levers.text(fast)}"
    if (intent.cuda_graph_reason or "").startswith("CUDA_GRAPH=") and replan_differs(rec) is not None:
        return intent.cuda_graph_reason  # the user chose other than the auto policy would
    if cfg.extra_args:
        return "EXTRA_ARGS"
    # The WARMUP setting. Records from before it was kept have only the steps dropped, which tell the
    # setting only where the run logged more steps than that (an OOM at step 1 dropped none).
    warmup = cfg.warmup
    if warmup is None and (rec.iters_logged or 0) > DEFAULT_WARMUP:
        warmup = rec.warmup_iters
    if warmup is not None and warmup != DEFAULT_WARMUP:
        return f"WARMUP={warmup}"
    return ""


def unused_files(cfg: Config) -> frozenset[str]:
    """The FEATURE_FILES a run with this config never executed."""
    return frozenset(f for f, used in FEATURE_FILES.items() if not used(cfg))


def code_state(commit: str | None, root: Path = ROOT, unused: frozenset[str] = frozenset()) -> tuple[str, str]:
    """(CURRENT | OLDER | UNKNOWN, why) for the code of a megalab commit against ROOT's HEAD; changes to
    the `unused` files (a feature the run did not use) do not count."""
    return _code_state(commit, Path(root), unused, os.environ.get("MEGALAB_COMMIT"))


@functools.lru_cache(maxsize=256)
def _code_state(commit: str | None, root: Path, unused: frozenset[str], tree_commit: str | None) -> tuple[str, str]:
    if not commit:
        return OLDER, "no commit"
    if commit.endswith("-dirty"):  # record.py: the run code had uncommitted changes, which git cannot show
        return UNKNOWN, f"run code changed before the run, uncommitted ({commit[:7]}-dirty)"
    # Where git cannot compare (a tree copied without our .git: the GPU rig), the tree's own commit, which
    # the launching side names in MEGALAB_COMMIT as the records made from it do (record.py), still can:
    # a run of that very commit ran this code.
    same_tree = (CURRENT, "") if commit == tree_commit else None
    head = git.run(root, "rev-parse", "--verify", "--quiet", "HEAD")
    if head is None or head.returncode != 0:
        return same_tree or (UNKNOWN, "no git")
    known = git.run(root, "cat-file", "-e", f"{commit}^{{commit}}")
    if known is None or known.returncode != 0:
        return same_tree or (UNKNOWN, f"commit {commit[:7]} not in this clone")
    anc = git.run(root, "merge-base", "--is-ancestor", commit, "HEAD")
    if anc is None or anc.returncode not in (0, 1):
        return UNKNOWN, "git failed"
    if anc.returncode == 1:
        return OLDER, f"{commit[:7]} not in HEAD's history"
    # the net difference, not the commits that touched the paths: a change made and undone is no change
    diff = git.run(root, "diff", "--raw", "--no-abbrev", commit, "HEAD", "--", *CODE_PATHS)
    if diff is None or diff.returncode != 0:
        return UNKNOWN, "git failed"
    files = []
    for line in diff.stdout.splitlines():  # ":mode mode old-blob new-blob status\tpath"
        meta, _, path = line.partition("\t")
        _, _, old, new, status = meta.split()[:5]
        if path not in unused and not (status == "M" and inert_blobs(root, old, new, path)):
            files.append(path)
    return (OLDER, f"{CODE_CHANGED} ({', '.join(Path(f).name for f in files[:3])}"
                   f"{', ...' if len(files) > 3 else ''})") if files else (CURRENT, "")


LEVER_TABLE = "megalab/runtime/levers.py"
# The lever table's fields only the launcher, the estimator and the pages read (a run installs by name, install,
# needs, requires, conflicts and spec): Lever(name, does, install, where, ...)'s 2nd and 4th arguments, or by name
LAUNCHER_FIELDS = ("does", "where", "estimated", "evidence")


def inert_blobs(root: Path, old: str, new: str, path: str) -> bool:
    """Whether a file's change from blob OLD to blob NEW cannot alter a run that used it: its module-level statements
    at OLD are all still there, unchanged and in order (the module's docstring aside), and what it gained is only
    new functions, classes or constant assignments of new names. In the lever table the fields no run reads
    (LAUNCHER_FIELDS: the default's `where` and RULES, the estimator's flag, the pages' text) do not count. A file
    that is not Python, or not readable, is never inert. Blobs are read and parsed once a process (by their id)."""
    if not path.endswith(".py"):
        return False
    before, after = (_blob_statements(root, blob, path == LEVER_TABLE) for blob in (old, new))
    if before is None or after is None:
        return False
    kept = iter(after)  # the old statements, unchanged and in order, among the new ones
    if not all(any(a == b for a in kept) for b in before):
        return False
    old_names = {n for _, _, names in before for n in names}
    return all(kind in ("def", "const") and not names & old_names for _, kind, names in after
               if (_, kind, names) not in before)


@functools.lru_cache(maxsize=512)
def _blob_statements(root: Path, blob: str, lever_table: bool) -> tuple | None:
    """_statements of a git blob (content-addressed: one read and parse per id), None where git or Python cannot."""
    text = git.run(root, "cat-file", "-p", blob)
    if text is None or text.returncode != 0:
        return None
    try:
        return tuple(_statements(text.stdout, lever_table))
    except SyntaxError:
        return None


def _statements(text: str, lever_table: bool) -> list[tuple[str, str, frozenset[str]]]:
    """A module's top-level statements (the docstring dropped; in the lever table without LAUNCHER_FIELDS and RULES),
    each as (ast.dump, kind: def | const | other, the top-level names it defines)."""
    import ast

    body = ast.parse(text).body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]
    out = []
    for node in body:
        if lever_table:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "RULES" for t in node.targets):
                continue
            for call in ast.walk(node):
                if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "L":
                    call.args = call.args[:1] + call.args[2:3] + call.args[4:]
                    call.keywords = [k for k in call.keywords if k.arg not in LAUNCHER_FIELDS]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            # a decorator or a metaclass runs at import: not a plain definition
            plain = not node.decorator_list and not getattr(node, "keywords", None)
            kind, names = "def" if plain else "other", {node.name}
        elif isinstance(node, ast.Assign):  # a new name bound to a constant: importing it runs nothing new
            plain = all(isinstance(t, ast.Name) for t in node.targets)
            kind = "const" if plain and not any(isinstance(n, ast.Call) for n in ast.walk(node.value)) else "other"
            names = {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        else:
            kind, names = "other", set()
        out.append((ast.dump(node), kind, frozenset(names)))
    return out


# argv items that name this run rather than decide it: its port and its run directory
_RUN_NAMES = ("--master_port",)


def _decisions(argv: list[str], run_dir: str | None) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in _RUN_NAMES:
            skip = True
            continue
        if a.endswith("/pretrain_gpt.py"):  # the checkout's own path (the rig's, a clone's) is no decision
            a = "pretrain_gpt.py"
        out.append(a.replace(run_dir, "RUN_DIR") if run_dir else a)
    return out


def _port(intent) -> int | None:
    """The port as the record's launch met: none where torchrun --standalone picked it (one node, since
    megalab/core/ports.py), else its own, else the old fixed 6000."""
    return None if "--standalone" in intent.argv else intent.master_port or ports.DEFAULT_PORT


def replan_differs(r: RunRecord) -> str | None:
    """Would `make <target>` today run what this record ran? The launcher plans the record's target
    again with its variables on a machine like its own (intent.machine) and compares the Megatron argv
    (its port and run dir aside): any other flag, lever or CUDA-graph decision makes the row older.
    The one place the results side asks the launcher: what it would do now."""
    intent, cfg = r.intent, r.config
    try:
        exp = catalog.get(r.target)
    except CatalogError:
        return "target no longer in the catalog"
    try:  # the schema reads an old record's "80" as 80.0, the make variable's type
        opts = Options(iters=cfg.iters or 100, gpu_mem_gb=cfg.gpu_mem_gb, nnodes=cfg.nnodes or 1,
                       node_rank=cfg.node_rank or 0, master_port=_port(intent), data=cfg.data or "mock")
        # the machine it ran on (older launchers kept the card's memory uncapped), under its cap
        machine = intent.machine.model_copy(update={"gpu_memory_gib": plan.capped(intent.machine.gpu_memory_gib,
                                                                                  opts.gpu_mem_gb)})
        today = plan.build(exp, opts, machine, run_dir=Path(intent.run_dir) if intent.run_dir else None)
    except (LaunchError, ValueError, KeyError) as e:
        return f"not plannable today ({e})"
    if _decisions(today.argv, intent.run_dir) != _decisions(intent.argv, intent.run_dir):
        return "today's plan differs (flags or CUDA graph)"
    return None


def of(r: RunRecord, root: Path = ROOT) -> Provenance:
    """The record's verdict: settings first (a schema-1 record says nothing more), then what the
    launcher would plan today, then the code inside torchrun."""
    why = settings_differ(r)
    if why:
        return Provenance(OLDER, why)
    if r.intent:
        why = replan_differs(r)
        if why:
            return Provenance(OLDER, why)
    state, why = code_state(r.versions.megalab_commit, Path(root), unused_files(r.config))
    return Provenance(state, why)


def code_key(r: RunRecord, root: Path = ROOT, unused: frozenset[str] | None = None) -> str:
    """Which code a record ran: 'current' for any commit with today's code, else the content of
    CODE_PATHS at its commit (the run's unused feature files aside, or the `unused` given: a trial keys
    both its sides by the files neither used), so that two older commits with the same run code are one
    code; the commit itself where git cannot read it."""
    commit = r.versions.megalab_commit
    unused = unused_files(r.config) if unused is None else unused
    if code_state(commit, Path(root), unused)[0] == CURRENT:
        return CURRENT
    return _code_content(str(commit), Path(root), unused) or str(commit)


def shared_code_key(r: RunRecord, fast, root: Path = ROOT) -> str:
    """code_key over the files this record ran or a run with the fast path `fast` (lever names) would: the two
    sides of a comparison at one commit, a lever and its base, are one code though only one ran the lever's file."""
    other = r.config.model_copy(update={"fastpath": tuple(sorted(fast))})
    return code_key(r, root, unused_files(r.config) & unused_files(other))


@functools.lru_cache(maxsize=256)
def _code_content(commit: str, root: Path, unused: frozenset[str]) -> str | None:
    """A digest of the files (path and blob) under CODE_PATHS at `commit`, or None where git cannot say."""
    import hashlib

    listing = git.run(root, "ls-tree", "-r", commit, "--", *CODE_PATHS)
    if listing is None or listing.returncode != 0 or not listing.stdout.strip():
        return None
    kept = [ln for ln in listing.stdout.splitlines() if ln.split("\t", 1)[-1] not in unused]
    return "code " + hashlib.sha1("\n".join(kept).encode()).hexdigest()[:10]


def setup_key(rec: RunRecord, root: Path = ROOT) -> tuple:
    """records.setup_key with the machine (host_key: every rig machine is called 'vm', so its first GPU's
    UUID) and the code read from git: runs at two commits with the same run code (no CODE_PATHS change
    between them) on one machine are repeats of one measurement."""
    return (host_key(rec), code_key(rec, root), *settings(rec))


def plain_make(r: RunRecord) -> bool:
    """Whether a record is what plain `make <target>` gives today (today's settings: settings_differ), as a page's
    row wants it, rather than a lever trial's launch of the target with other settings."""
    return not settings_differ(r)


def load_rows(runs: Path, who: str, tree: Path = ROOT) -> dict[str, RunRecord]:
    """The record each page's row of a target stands on: the newest usable one, a plain `make <target>`'s where
    there is one (records.load_records with plain_make), its repeats grouped by machine, settings and code as git
    sees it in TREE."""
    return _records.load_records(Path(runs), lambda r: setup_key(r, tree), who, prefer=plain_make)


def comparable_key(r: RunRecord, root: Path = ROOT) -> str | None:
    """Which runs' step times may be divided by each other: one machine (machine_of), and one code and
    defaults (both `today`, or the same commit). None for a record without a host (it cannot be told apart)."""
    host = machine_of(r)
    if host is None:
        return None
    code = "today" if of(r, root).state == CURRENT else str(r.versions.megalab_commit)
    return f"{host} @ {code}"


def comparable_keys(r: RunRecord, root: Path = ROOT) -> tuple[str, ...]:
    """comparable_key, and for a run of today's code and defaults also its own commit's key: runs of one
    commit on one machine stay comparable after a new default ages some of them (a graphed row) and leaves
    others today's (a row without the graph)."""
    key = comparable_key(r, root)
    if key is None:
        return ()
    own = f"{machine_of(r)} @ {r.versions.megalab_commit}"
    return (key,) if key == own else (key, own)


def machine_of(r: RunRecord) -> str | None:
    """The machine a comparison may treat as one: host_key, and where the record has no GPU UUID also the
    number of GPUs it saw. Every rig machine is called `vm`: without a UUID a 2x and an 8x H200 host
    would be one name, and two runs are only paired where at least their machines' GPU counts agree."""
    host = host_key(r)
    if host is None or r.gpu_uuids:
        return host
    return f"{host} x{r.gpus_on_node or r.num_gpus or '?'}"


def card(r: RunRecord) -> str | None:
    """The card a record ran on, by its first GPU's UUID ('GPU-177d0ba1'): how the pages name a machine, as
    two cards of one kind differ by a few percent (None where the record has no UUID)."""
    return r.gpu_uuids[0][:12] if r.gpu_uuids else None


def host_key(r: RunRecord) -> str | None:
    """Which machine a record ran on (None without a host name)."""
    return machine_key(r.hostname, r.gpu_name, r.gpu_uuids)


def machine_key(hostname: str | None, gpu_name: str | None, gpu_uuids: list[str] | tuple = ()) -> str | None:
    """A machine's name: host, first GPU's name and UUID (None without a host name)."""
    if hostname is None:
        return None
    # every rig machine is called "vm": the first GPU's UUID names the host where the record has it
    # (records from before it was kept fall back to the name, and their commit tells them apart)
    return f"{hostname} {gpu_name or ''}".strip() + (f"/{gpu_uuids[0][:13]}" if gpu_uuids else "")
