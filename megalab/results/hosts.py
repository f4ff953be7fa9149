"""Which machine a run ran on, and which other runs may have shared that machine while it ran.

Every rig machine calls itself `vm`, so the host name tells nothing; a GPU's UUID belongs to one machine.
Records that name a common GPU ran on one machine, so the GPU sets of all records are joined where they
meet (a 4-GPU host whose runs saw GPUs 0-3, or 0,1 and 2,3 plus one run of all four, is one machine). A
machine's key is its GPU model and the smallest UUID of its joined set (`H100-4fab5618`): the same on
every page, derived from the records alone. A record without a UUID (before they were kept) has the key
`<model>x<GPUs it saw>-noid`, which may stand for several machines.

Two runs may have shared a machine unless the records prove otherwise: other GPU models or host names, or
GPU sets of two machines where at least one set is known to be its whole machine (`node_gpu_uuids`, every
GPU NVML sees on the node, or `gpu_uuids` where CUDA_VISIBLE_DEVICES hid none). Two runs on GPUs 0,1 and
2,3 of one host cannot be told apart from two hosts by their records alone: they may have shared it.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from pathlib import Path

from megalab.core.gpus import short_gpu_name
from megalab.core.records import RunRecord, read_records

NO_UUID = "noid"


def model(r: RunRecord) -> str:
    """The GPU model in one word ('H100', 'H200'; '?' where the record does not say)."""
    return (short_gpu_name(r.gpu_name) or "?").split()[0] if r.gpu_name else "?"


def _uuids(r: RunRecord) -> frozenset[str]:
    return frozenset(r.node_gpu_uuids or ()) | frozenset(r.gpu_uuids or ())


def whole(r: RunRecord) -> bool:
    """Whether the record's GPU set is its whole machine: the node's UUIDs are recorded, or the run saw every
    GPU (no CUDA_VISIBLE_DEVICES hid one)."""
    return bool(r.node_gpu_uuids) or (bool(r.gpu_uuids) and not (r.cuda_visible_devices or "").strip())


@dataclasses.dataclass(frozen=True)
class Run:
    """What this module needs of a record: its folder, target, GPUs and time window."""
    name: str
    target: str
    model: str
    hostname: str | None
    uuids: frozenset[str]
    whole: bool
    seen: int  # GPUs it saw
    window: tuple[float, float] | None

    @classmethod
    def of(cls, r: RunRecord) -> Run:
        return cls(name=_name(r), target=r.target, model=model(r), hostname=r.hostname, uuids=_uuids(r),
                   whole=whole(r), seen=r.gpus_on_node or r.num_gpus or 0, window=r.window)


def _name(r: RunRecord) -> str:
    """A record's folder name ('' for one made in memory: a test's)."""
    return r.run_dir.name if r.run_dir is not None else ""


class Hosts:
    """The machines of a set of records (RESULTS' every run.json, all collections) and who ran beside whom."""

    def __init__(self, records: Iterable[RunRecord]):
        self.runs = [Run.of(r) for r in records]
        parent: dict[str, str] = {}

        def find(u: str) -> str:
            while parent.setdefault(u, u) != u:
                parent[u] = parent[parent[u]]
                u = parent[u]
            return u

        for run in self.runs:
            first, *rest = sorted(run.uuids) or [None]
            if first is not None:
                find(first)
            for u in rest:
                parent[find(u)] = find(first)
        groups: dict[str, list[str]] = {}
        for u in list(parent):
            groups.setdefault(find(u), []).append(u)
        self._machine = {u: min(members) for members in groups.values() for u in members}
        self._by_start = sorted((run for run in self.runs if run.window), key=lambda run: run.window[0])

    @classmethod
    def under(cls, results: Path, who: str = "megalab", extra: Iterable[RunRecord] = ()) -> Hosts:
        """Every record under RESULTS (rows, bench, holdout, data, integrity, quickstart runs), and the EXTRA
        records from elsewhere (`make compare`'s outdir), a folder counted once."""
        found = list(read_records(Path(results), who, "**/run.json"))
        dirs = {r.run_dir for r in found}
        return cls([*found, *(r for r in extra if r.run_dir is None or r.run_dir not in dirs)])

    def machine(self, run: Run) -> str | None:
        """The smallest UUID of the run's machine (None without a UUID)."""
        return self._machine.get(min(run.uuids)) if run.uuids else None

    def key(self, r: RunRecord | Run) -> str:
        """The machine's key: 'H100-4fab5618', or 'H200x2-noid' for a record without a GPU UUID."""
        run = r if isinstance(r, Run) else Run.of(r)
        m = self.machine(run)
        return f"{run.model}-{m[4:12]}" if m else f"{run.model}x{run.seen or '?'}-{NO_UUID}"

    def may_share(self, a: Run, b: Run) -> bool:
        """Whether two runs may have been on one machine (see the module's doc)."""
        if a.hostname and b.hostname and a.hostname != b.hostname:
            return False
        if a.model != b.model:
            return False
        if not (a.uuids and b.uuids):
            return True  # a run without a UUID could have been anywhere of its model
        if self.machine(a) == self.machine(b):
            return True
        return not (a.whole or b.whole)

    def beside(self, r: RunRecord | Run) -> list[Run]:
        """The other runs whose time overlapped this one's and which may have shared its machine (own GPUs, but
        shared CPUs, host memory and links), in start order; [] without a time window."""
        run = r if isinstance(r, Run) else Run.of(r)
        if not run.window:
            return []
        s, e = run.window
        out = []
        for other in self._by_start:
            if other.window[0] >= e:
                break
            if other.window[1] > s and (other.name, other.target) != (run.name, run.target) \
                    and self.may_share(run, other):
                out.append(other)
        return out


def mark(recs: dict, results: Path, who: str = "megalab") -> dict:
    """RECS (any key -> RunRecord) with `concurrent` set on each: the targets of the runs that may have shared its
    machine while it ran (Hosts.beside over every record under RESULTS), for the pages that mark them †."""
    hosts = Hosts.under(results, who, recs.values())
    return {k: r.grouped(r.runs, [o.target for o in hosts.beside(r)]) for k, r in recs.items()}


_COMMITTED: dict[str, tuple[tuple, Hosts]] = {}


def committed(results: Path) -> Hosts:
    """Hosts.under(RESULTS), made again only when a record file under it changed (pages read it many times)."""
    results = Path(results)
    stamp = tuple(sorted((str(p), (st := os.stat(p)).st_mtime_ns, st.st_size)
                         for p in results.glob("**/run.json") if p.is_file()))
    seen = _COMMITTED.get(str(results))
    if seen is None or seen[0] != stamp:
        seen = _COMMITTED[str(results)] = (stamp, Hosts.under(results))
    return seen[1]
