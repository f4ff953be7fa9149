"""Like for like: what the runs a comparison divides, subtracts or ranks must share, and where they differ.

A ratio of two rows' step times teaches the parallelism idea that differs between the rows only when
nothing else does. FACETS are the rest: the machine (hosts.py: the GPUs' UUIDs, not the host name every
rig machine shares), the run code (provenance.code_key: git's view of megalab/runtime), the fast-path
levers (FAST), Megatron's full-iteration CUDA graph, ITERS and WARMUP, precision, the GPU_MEM_GB cap, the
layer spec and Transformer Engine, EXTRA_ARGS and the software (torch, megatron-core). Besides, no run may
have had another run beside it on its machine (hosts.Hosts.beside: own GPUs, shared CPUs and links).

`differences` lists every facet on which the runs behind some targets differ (each row's repeats
included), as one Difference each; checks.py refuses a claim with any it does not declare, and the
pages' ratio cells and quotes say `unlike` instead of dividing; `key` groups the runs a figure may divide.
"""
from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from megalab.core import provenance
from megalab.core.records import RunRecord
from megalab.results.hosts import Hosts

BESIDE = "beside"  # the facet name of "another run shared its machine while it ran"


def precision(r: RunRecord) -> str:
    """bf16, fp16 or fp8 (its format), from the argv the run had (the launcher always passes --bf16)."""
    words = [*(r.intent.argv if r.intent else ()), *(r.config.catalog_extra_args or ())]
    try:
        words += shlex.split(r.config.extra_args or "")
    except ValueError:
        words.append(r.config.extra_args or "")
    if "--fp8-format" in words:
        i = words.index("--fp8-format")
        return "fp8 " + (words[i + 1] if i + 1 < len(words) else "?")
    return "fp16" if "--fp16" in words else "bf16"


def graph(r: RunRecord) -> str:
    """'on' or 'off': whether the run had Megatron's full-iteration CUDA graph."""
    on = r.config.cuda_graph if r.config.cuda_graph is not None else (r.intent.cuda_graph if r.intent else None)
    return "on" if on else "off"


def _commit(r: RunRecord) -> str:
    return str(r.versions.megalab_commit or "no commit")[:7]


@dataclasses.dataclass(frozen=True)
class Facet:
    name: str  # as a claim's `differs` names it
    label: str  # as a page names it
    value: Callable[[RunRecord, Hosts, Path], Any]  # what must be equal
    shown: Callable[[RunRecord, Hosts, Path], str]  # how a page shows one run's value


def _machine(r: RunRecord, hosts: Hosts, root: Path) -> tuple:
    key = hosts.key(r)  # a record without a UUID: one machine only as far as its host name, GPUs and commit say
    return (r.hostname, key, r.versions.megalab_commit) if key.endswith("-noid") else (r.hostname, key)


def _machine_shown(r: RunRecord, hosts: Hosts, root: Path) -> str:
    return hosts.key(r) + ("" if r.hostname in (None, "vm") else f" on {r.hostname}")


def _code(r: RunRecord, hosts: Hosts, root: Path) -> str:
    return provenance.code_key(r, root)


FACETS: tuple[Facet, ...] = (
    Facet("machine", "machine", _machine, _machine_shown),
    Facet("code", "run code", _code, lambda r, h, root: f"commit {_commit(r)}"),
    Facet("fastpath", "FAST", lambda r, h, root: tuple(r.fastpath or ()),
          lambda r, h, root: ",".join(r.fastpath) if r.fastpath else "unset"),
    Facet("cuda_graph", "CUDA graph", lambda r, h, root: graph(r), lambda r, h, root: graph(r)),
    Facet("iters", "ITERS", lambda r, h, root: r.config.iters or r.train_iters,
          lambda r, h, root: str(r.config.iters or r.train_iters)),
    Facet("warmup", "WARMUP", lambda r, h, root: r.warmup_iters, lambda r, h, root: str(r.warmup_iters)),
    Facet("precision", "precision", lambda r, h, root: precision(r), lambda r, h, root: precision(r)),
    Facet("gpu_mem_gb", "GPU_MEM_GB", lambda r, h, root: r.config.gpu_mem_gb,
          lambda r, h, root: "uncapped" if r.config.gpu_mem_gb is None else f"{r.config.gpu_mem_gb:g}"),
    Facet("spec", "layer spec", lambda r, h, root: (r.transformer_impl, r.config.spec),
          lambda r, h, root: f"{r.config.spec or '?'} ({r.transformer_impl or '?'})"),
    Facet("extra_args", "EXTRA_ARGS", lambda r, h, root: r.config.extra_args or "",
          lambda r, h, root: repr(r.config.extra_args or "")),
    Facet("software", "torch / megatron-core", lambda r, h, root: (r.versions.torch, r.versions.megatron_core),
          lambda r, h, root: f"{r.versions.torch} / {r.versions.megatron_core}"),
)
NAMES = (*(f.name for f in FACETS), BESIDE)


@dataclasses.dataclass(frozen=True)
class Difference:
    """One facet on which the runs differ: its name, and per target (short id) the values its runs show."""
    facet: str
    label: str
    values: tuple[tuple[str, str], ...]  # (short target id, its runs' values, ', '-joined)

    @property
    def text(self) -> str:
        """'CUDA graph: 114 off, 115 on' / 'ran beside other runs: 331 (beside 352 and 342)'."""
        return f"{self.label}: " + ", ".join(f"{t} {v}" for t, v in self.values)


def _short(target: str) -> str:
    return target.split("-", 1)[0]


def _levers(runs: Mapping[str, Sequence[RunRecord]]) -> Callable[[RunRecord], str]:
    """How a run's FAST differs from the levers every compared run has: '+triton_norm+fused_wgrad', or 'the
    shared levers' (a lever list is long; its difference is what a reader needs)."""
    sets = [set(r.fastpath or ()) for rs in runs.values() for r in rs]
    common = set.intersection(*sets) if sets else set()

    def show(r: RunRecord) -> str:
        extra = sorted(set(r.fastpath or ()) - common)
        return "".join(f"+{x}" for x in extra) if extra else ("unset" if not r.fastpath else "the shared levers")
    return show


def differences(runs: Mapping[str, Sequence[RunRecord]], hosts: Hosts, root: Path) -> list[Difference]:
    """Every facet on which the runs behind TARGETS (target -> its runs: a row's repeats) differ, in FACETS'
    order, then the runs that had another run beside them on their machine."""
    out = []
    every = [r for rs in runs.values() for r in rs]
    # one code: the run code of every file any of them ran (a CP run's attention file counts for the pair)
    unused = frozenset.intersection(*(provenance.unused_files(r.config) for r in every)) if every else frozenset()
    for f in FACETS:
        value = (lambda r: provenance.code_key(r, root, unused)) if f.name == "code" else \
            (lambda r, f=f: f.value(r, hosts, root))
        values = {value(r) for r in every}
        if len(values) > 1:
            show = _levers(runs) if f.name == "fastpath" else lambda r: f.shown(r, hosts, root)
            shown = tuple((_short(t), ", ".join(dict.fromkeys(show(r) for r in rs))) for t, rs in runs.items())
            out.append(Difference(f.name, f.label, shown))
    beside = tuple((_short(t), "(beside " + ", ".join(dict.fromkeys(_short(o.target) for o in others)) + ")")
                   for t, rs in runs.items() if (others := [o for r in rs for o in hosts.beside(r)]))
    if beside:
        out.append(Difference(BESIDE, "another run beside it", beside))
    return out


def key(r: RunRecord, hosts: Hosts, root: Path) -> str:
    """One text that two runs share only where they are like for like, for grouping (a figure divides the
    points of one key only): every facet's value, the code counted over every file of megalab/runtime, and a
    run that may have shared its machine with another is like no other run."""
    values = [provenance.code_key(r, root, frozenset()) if f.name == "code" else f.value(r, hosts, root)
              for f in FACETS]
    beside = hosts.beside(r)
    return "|".join(map(str, values)) + (f"|beside:{r.run_dir.name if r.run_dir else id(r)}" if beside else "")
