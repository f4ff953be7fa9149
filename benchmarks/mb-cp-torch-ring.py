"""megalab's context-parallel attention against torch's own ring attention, on real GPUs with real transfers.

    torchrun --nproc-per-node CP benchmarks/mb-cp-torch-ring.py TARGET [TARGET ...] [--reps 20]

Each rank holds the two sequence chunks Megatron's data path gives it (r and 2*CP-1-r, megalab's and torch's
head-tail load balancing alike; the script checks torch's layout against megalab's) and runs one layer's causal
attention, forward and backward, for the target's micro-batch, heads and sequence:

* megalab `p2p` (ring_attention), `all_gather` and `a2a` (megalab/runtime/cp_attention.py);
* torch's ring (torch.distributed.tensor.experimental.context_parallel's SDPA dispatcher) with its two K/V
  rotations, `allgather` (torch's default) and `alltoall`.
A grouped-query target's K/V are copied to every query head first, inside the timed call, for all of them: what
megalab's spec does before any CP mode, and what torch's blocks need.

Every implementation runs flash-attention blocks (SDPA's flash backend). The time is the slowest rank's, per
call, after a barrier; `ideal` is 1/CP of one flash call over the whole sequence on one GPU (what a fused CP
kernel does at best per rank, transfers free). Each output and input gradient is checked against that whole-
sequence call, cut to the rank's chunks (bf16: differences of a few 1e-2 are rounding).
"""
from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from megalab.core import catalog
from megalab.runtime import cp_attention

# On a GPU: bf16 and flash blocks. Without one (a smoke test under gloo): fp32 and the math backend, where
# torch's ring has no kernel to dispatch to and says so in its row.
DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEV == "cuda" else torch.float32
BACKEND = SDPBackend.FLASH_ATTENTION if DEV == "cuda" else SDPBackend.MATH


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def torch_cp():
    """torch's CP module (its path moved between releases) and the public context manager."""
    try:
        from torch.distributed.tensor.experimental._context_parallel import _attention as cpa
    except ImportError:
        from torch.distributed.tensor.experimental import _attention as cpa
    from torch.distributed.tensor.experimental import context_parallel
    return cpa, context_parallel


def local(x: torch.Tensor, rank: int, cp: int, dim: int = 2) -> torch.Tensor:
    """This rank's two chunks of a whole-sequence tensor, in Megatron's layout."""
    chunks = x.chunk(2 * cp, dim=dim)
    return torch.cat([chunks[i] for i in cp_attention.chunk_ids(rank, cp)], dim=dim).contiguous()


def timed(fn, reps: int, warmup: int = 3) -> float:
    """The slowest rank's milliseconds per call."""
    for _ in range(warmup):
        fn()
    sync()
    dist.barrier()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    ms = torch.tensor([(time.perf_counter() - t) / reps * 1e3], device=DEV)
    dist.all_reduce(ms, op=dist.ReduceOp.MAX)
    return ms.item()


def peak_mib(fn) -> float:
    """The largest rank's memory above what was allocated before one call."""
    if DEV != "cuda":
        return float("nan")
    sync()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    sync()
    mib = torch.tensor([(torch.cuda.max_memory_allocated() - base) / 2**20], device=DEV)
    dist.all_reduce(mib, op=dist.ReduceOp.MAX)
    return mib.item()


def shapes(target: str) -> tuple[int, int, int, int, int]:
    """(micro-batch, heads, K/V groups, sequence, head dim) of a catalog target's attention."""
    exp = catalog.get(target)
    m = exp.model_cfg
    n = m["num_attention_heads"]
    return exp.mbs, n, m.get("num_query_groups") or n, m["seq_length"], m["hidden_size"] // n


def bench_target(target: str, reps: int, mesh, rank: int, cp: int, shape=None) -> None:
    b, n, g, s, d = shape or shapes(target)
    scale = d ** -0.5
    gen = torch.Generator(device=DEV).manual_seed(1234)  # the same whole tensors on every rank
    full = [torch.randn(b, h, s, d, device=DEV, dtype=DTYPE, generator=gen) for h in (n, g, g)]
    dout_full = torch.randn(b, n, s, d, device=DEV, dtype=DTYPE, generator=gen)

    with sdpa_kernel(BACKEND):
        leaves = [t.clone().requires_grad_() for t in full]
        k_, v_ = (t.repeat_interleave(n // g, dim=1) if g != n else t for t in leaves[1:])
        out = F.scaled_dot_product_attention(leaves[0], k_, v_, is_causal=True, scale=scale)
        out.backward(dout_full)
        want = [local(t, rank, cp) for t in (out.detach(), *(x.grad for x in leaves))]
        ideal = timed(lambda: F.scaled_dot_product_attention(
            *(t.detach().requires_grad_() for t in (leaves[0], k_, v_)), is_causal=True, scale=scale
        ).backward(dout_full), reps) / cp
        del leaves, k_, v_, out

    ins = [local(t, rank, cp) for t in full]
    dout = local(dout_full, rank, cp)
    group = mesh.get_group()
    cpa, context_parallel = torch_cp()

    def run(attn):
        leaves = [t.clone().requires_grad_() for t in ins]
        q, k, v = leaves
        if g != n:  # what megalab's spec does before any CP mode: the K/V copied to every query head
            k, v = (t.repeat_interleave(n // g, dim=1) for t in (k, v))
        o = attn(q, k, v)
        o.backward(dout)
        return [o.detach(), *(x.grad for x in leaves)]

    def torch_ring(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)

    impls = {"megalab p2p (ring)": lambda *a: cp_attention.ring_attention(*a, group, scale),
             "megalab all_gather": lambda *a: cp_attention.all_gather_attention(*a, group, scale),
             "megalab a2a": lambda *a: cp_attention.a2a_attention(*a, group, scale)}
    rows = []
    with sdpa_kernel(BACKEND):
        for name, attn in impls.items():
            if name.endswith("a2a") and n % cp:
                rows.append((name, None, None, None, "heads not divisible by CP"))
                continue
            got = run(attn)
            err = max((a.float() - w.float()).abs().max().item() for a, w in zip(got, want))
            rows.append((name, timed(lambda: run(attn), reps), peak_mib(lambda: run(attn)), err, ""))
        for rotate in ("allgather", "alltoall"):
            cpa.set_rotate_method(rotate)
            positions = torch.arange(s, device=DEV).unsqueeze(0)  # torch shards it: where its layout puts us
            try:
                with context_parallel(mesh, buffers=[positions], buffer_seq_dims=[1]):
                    same = torch.equal(positions[0], local(torch.arange(s, device=DEV), rank, cp, dim=0))
                    got = run(torch_ring)
                    err = max((a.float() - w.float()).abs().max().item() for a, w in zip(got, want))
                    rows.append((f"torch ring ({rotate})", timed(lambda: run(torch_ring), reps),
                                 peak_mib(lambda: run(torch_ring)), err,
                                 "" if same else "torch's layout is not Megatron's: the error is not comparable"))
            except Exception as e:  # an API torch moved, or no kernel to dispatch to: the row says which
                rows.append((f"torch ring ({rotate})", None, None, None, f"failed: {type(e).__name__}: "
                             f"{str(e).splitlines()[0][:160] if str(e) else ''}"))
    if rank == 0:
        print(f"\n{target}: micro-batch {b}, {n} heads ({g} K/V groups) of {d}, sequence {s}, CP={cp} "
              f"({s // cp} tokens a rank); one layer's attention, forward + backward; ideal (1/CP of one whole "
              f"flash call) {ideal:.3f} ms")
        print("| implementation | ms per call (slowest rank) | / ideal | peak MiB above inputs | max abs error | note |")
        print("| --- | --- | --- | --- | --- | --- |")
        for name, ms, mib, err, note in rows:
            cells = ("not run", "", "", "") if ms is None else (f"{ms:.3f}", f"{ms / ideal:.2f}", f"{mib:.0f}",
                                                                  f"{err:.1e}")
            print(f"| {name} | " + " | ".join(cells) + f" | {note} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("targets", nargs="+")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--shape", help="B,HEADS,GROUPS,SEQ,DIM instead of the target's (a small CPU smoke test)")
    a = ap.parse_args()
    from torch.distributed.device_mesh import init_device_mesh

    rank, cp = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if DEV == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if DEV == "cuda" else "gloo")
    mesh = init_device_mesh(DEV, (cp,))
    if rank == 0:
        print(f"# torchrun --nproc-per-node {cp} benchmarks/mb-cp-torch-ring.py {' '.join(a.targets)}: "
              f"{torch.cuda.get_device_name() if DEV == 'cuda' else 'CPU'} x{cp}, torch {torch.__version__}, reps {a.reps}")
    try:
        for target in a.targets:
            bench_target(target, a.reps, mesh, rank, cp,
                         tuple(int(x) for x in a.shape.split(",")) if a.shape else None)
            torch.cuda.empty_cache() if DEV == "cuda" else None
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
