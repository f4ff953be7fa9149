"""`make bench`: Megatron's stock local spec vs megalab's TE-free spec, measured in one GPU run.

    python -m megalab bench run            the whole benchmark (configs/bench.yaml) -> results/bench/
    python -m megalab bench matmul         the bf16 8192^3 matmul ceiling only
    python -m megalab bench trace FILE     where a step's time goes, from a torch profiler trace
    python -m megalab bench wgrad TARGET   fused_wgrad's kernels against Megatron's unfused accumulation
    python -m megalab bench cp TARGET      one rank's ring-attention compute against 1/CP of one flash call
    python -m megalab bench gaps FILE      where the GPU waited for the host in a profiler trace
    python -m megalab bench clocks RUN     a run's SM clock, power and what held the clock down, GPU busy
    python -m megalab bench-report         rebuild results/bench/README.md from the committed runs

Every case is an ordinary megalab launch (`launch.run`): same wrapper, same monitor, same record,
so a bench number and a table number are measured the same way. Cases that differ from a catalog
target only by batch size carry their own id (`<target>@gbs<N>`) and their full layout in the record.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import time
from collections import defaultdict
from pathlib import Path


from megalab.core import markdown

# What a run is and how its record is found live on the results side (benchruns), which the report reads
# too: the report never imports this launcher, so the two cannot import each other.
from megalab.core.benchruns import (  # noqa: F401  (re-exported: bench.Run, bench.make_run, ...)
    BENCH_DIR, CONFIG, Run, ablation_runs, expert_runs, fits, load_config, load_runs, make_run, parity_runs,
    record_key, spec_run)
from megalab.core import catalog, clocks, infile, variables
from megalab.core.records import RunRecord
from megalab.harness import launch


class BenchError(RuntimeError):
    """One-line, user-facing."""


def require_gpu() -> None:
    import torch

    if not torch.cuda.is_available():
        raise BenchError("bench: no CUDA GPU found (torch.cuda.is_available() is False); "
                         "fix: run `make bench` on a GPU machine (it never runs in CI)")


# --------------------------------------------------------------------------- the ceiling
def matmul_tflops(n: int = 8192, iters: int = 50, warmup: int = 10) -> dict:
    """bf16 n^3 matmul throughput: the practical ceiling an MFU can be compared with."""
    import torch

    require_gpu()
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(warmup):
        a @ b
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    med = times[len(times) // 2]
    return {"n": n, "iters": iters, "median_ms": round(med, 4),
            "tflops": round(2 * n**3 / (med * 1e-3) / 1e12, 1),
            "tflops_best": round(2 * n**3 / (times[0] * 1e-3) / 1e12, 1),
            "gpu_name": torch.cuda.get_device_name(0), "torch": torch.__version__}


def ms_per_call(fn, reps: int, warmup: int, cuda: bool = True) -> float:
    """Milliseconds per call of fn: `warmup` calls first, then `reps` timed ones (synchronised on CUDA)."""
    import torch

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - t) / reps * 1e3


def kernel_us(fn, reps: int = 20, warmup: int = 5) -> tuple[float, float]:
    """fn's GPU time per call in microseconds (the kernels' own time, summed by torch.profiler) and its
    kernels per call: what a microbenchmark compares where the host's time must not count."""
    import torch
    from torch.autograd import DeviceType

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    return sum(e.time_range.elapsed_us() for e in kernels) / reps, len(kernels) / reps


# --------------------------------------------------------------------------- weight-gradient accumulation
def wgrad_shapes(target: str) -> tuple[int, list[tuple[str, int, int, int]]]:
    """(tokens per micro-batch, [(name, out, in, how many per step)]): the linear layers of a catalog
    target whose weight gradients Megatron accumulates into main_grad (TP=1 shapes)."""
    exp = catalog.get(target)
    m = exp.model_cfg
    h, L = m["hidden_size"], m["num_layers"]
    ffn = m.get("ffn_hidden_size") or 4 * h
    heads, groups = m["num_attention_heads"], m.get("num_query_groups") or m["num_attention_heads"]
    qkv = h + 2 * h * groups // heads
    fc1 = 2 * ffn if m.get("swiglu") else ffn
    vocab = -(-50257 // 128) * 128  # GPT-2 BPE, padded as Megatron pads it (make-vocab-size-divisible-by 128)
    return exp.mbs * m["seq_length"], [("qkv", qkv, h, L), ("proj", h, h, L), ("fc1", fc1, h, L),
                                        ("fc2", h, ffn, L), ("output", vocab, h, 1)]


def wgrad_accum(target: str, reps: int = 20) -> list[dict]:
    """Megatron's unfused path (a bf16 wgrad GEMM, then main_grad.add_) against fastpath.fused_wgrad's
    (one addmm into the fp32 main_grad), per linear shape of `target`, with the fused result's largest
    error against an fp64 reference on 256 tokens."""
    import torch

    from megalab.runtime import fastpath  # torch: imported only where a GPU benchmark runs

    require_gpu()
    tokens, shapes = wgrad_shapes(target)

    def timed(fn) -> float:
        return ms_per_call(fn, reps, warmup=3)

    out = []
    for name, o, i, count in shapes:
        x = torch.randn(tokens, i, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(tokens, o, device="cuda", dtype=torch.bfloat16)
        main = torch.zeros(o, i, device="cuda")
        unfused = timed(lambda: main.add_(dy.t() @ x))
        fused = timed(lambda: fastpath.wgrad_gemm_accum_fp32(x, dy, main))
        main.zero_()
        fastpath.wgrad_gemm_accum_fp32(x[:256], dy[:256], main)
        err = (main.double() - dy[:256].double().t() @ x[:256].double()).abs().max().item()
        out.append({"name": name, "out": o, "in": i, "per_step": count, "unfused_ms": round(unfused, 3),
                    "fused_ms": round(fused, 3), "max_abs_err": err, "fused_path": fastpath._ADDMM_OUT_DTYPE[0]})
    return out


def render_wgrad(target: str, rows: list[dict]) -> str:
    import torch

    lines = [f"{target}: torch {torch.__version__} on {torch.cuda.get_device_name()}",
             "| linear | out x in | per micro-batch | unfused ms | fused ms | max abs err vs fp64 | addmm out_dtype |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['name']} | {r['out']}x{r['in']} | {r['per_step']} | {r['unfused_ms']} | {r['fused_ms']} | "
              f"{r['max_abs_err']:.1e} | {r['fused_path']} |" for r in rows]
    tot = {k: sum(r[k] * r["per_step"] for r in rows) for k in ("unfused_ms", "fused_ms")}
    lines.append(f"per micro-batch: unfused {tot['unfused_ms']:.1f} ms, fused {tot['fused_ms']:.1f} ms")
    return "\n".join(lines)


# --------------------------------------------------------------------------- context-parallel attention compute
def cp_shapes(target: str) -> tuple[int, int, int, int, int]:
    """(micro-batch, heads, sequence, head dim, CP) of a catalog target's attention."""
    exp = catalog.get(target)
    m = exp.model_cfg
    heads = m["num_attention_heads"]
    return exp.mbs, heads, m["seq_length"], m["hidden_size"] // heads, exp.cp


def cp_compute(target: str, cps: tuple[int, ...] = (1, 2, 4, 8), reps: int = 10, device: str = "cuda",
               shapes: tuple[int, int, int, int] | None = None) -> list[dict]:
    """One rank's attention work in megalab's ring (runtime/cp_attention.py, forward and backward) with
    the ring's transfers replaced by local copies, against 1/CP of one flash-attention call over the whole
    sequence: what a fused CP kernel could do at best per rank. One GPU cannot show the communication;
    this measures what the ring costs besides it (CP block calls on ever smaller blocks, fp32 merges,
    the K/V stacking and gradient buffers). Rank 0's blocks: every rank of the load-balanced layout does
    the same arithmetic, in blocks of other shapes (rank 0 gives half its queries every key, the last
    rank all its queries half the keys). At large CP the wall time is mostly launches: compare the
    kernel columns."""
    import contextlib
    import types

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from megalab.runtime import cp_attention  # torch: imported only where the benchmark runs

    if device == "cuda":
        require_gpu()
    b, n, seq, d = shapes or cp_shapes(target)[:4]  # shapes: small ones for the CPU test
    scale = d ** -0.5
    dtype = torch.bfloat16 if device == "cuda" else torch.float32

    def timed(fn) -> float:
        return ms_per_call(fn, reps, warmup=2, cuda=device == "cuda")

    def leaf(s: int):
        return [torch.randn(b, n, s, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3)]

    def fwd_bwd(attn, q, k, v):
        out = attn(q, k, v)
        out.backward(torch.ones_like(out))

    def flash():  # the kernel the ring's blocks call
        return sdpa_kernel(SDPBackend.FLASH_ATTENTION) if device == "cuda" else contextlib.nullcontext()

    q, k, v = leaf(seq)
    with flash():
        whole_f = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale))
        whole_fb = timed(lambda: fwd_bwd(lambda *a: F.scaled_dot_product_attention(*a, is_causal=True, scale=scale),
                                         q, k, v))
    del q, k, v
    saved = cp_attention.dist, cp_attention._sendrecv
    out = []
    try:
        cp_attention._sendrecv = lambda t, group, rank, cp: (t.clone(), [])  # the received chunk: a local copy
        for cp in cps:
            if seq % (2 * cp):
                continue
            cp_attention.dist = types.SimpleNamespace(get_world_size=lambda g, cp=cp: cp, get_rank=lambda g: 0)
            q, k, v = leaf(seq // cp)
            ring = lambda *a: cp_attention.ring_attention(*a, None, scale)  # noqa: E731
            ring_f = timed(lambda: ring(q, k, v))
            ring_fb = timed(lambda: fwd_bwd(ring, q, k, v))
            row = {"cp": cp, "tokens_per_rank": seq // cp, "ideal_fwd_ms": round(whole_f / cp, 3),
                   "ring_fwd_ms": round(ring_f, 3), "ideal_fwd_bwd_ms": round(whole_fb / cp, 3),
                   "ring_fwd_bwd_ms": round(ring_fb, 3)}
            if device == "cuda":  # where the ring's time goes: its flash kernels against everything else
                row.update(_kernel_split(lambda: fwd_bwd(ring, q, k, v)))
            if cp == 1:  # one rank holds everything: the ring is plain causal attention, output and dq alike
                row["max_abs_diff_vs_flash"] = _ring_vs_flash(ring, q, k, v, scale, flash)
            elif device == "cuda" and b * n * (seq // cp) ** 2 * 4 < 8e9:  # the fused bf16 path against the
                # ring's fp32 math on the same blocks (whose scores it holds whole: only where they are small)
                row["max_abs_diff_vs_fp32"] = _ring_vs_fp32(ring, q, k, v)
            out.append(row)
            del q, k, v
    finally:
        cp_attention.dist, cp_attention._sendrecv = saved
    return out


def _ring_vs_flash(ring, q, k, v, scale: float, flash) -> float:
    """Largest |difference| of output and query gradient between the ring (CP=1) and one SDPA call."""
    import torch.nn.functional as F

    got = []
    for attn in (ring, lambda *a: F.scaled_dot_product_attention(*a, is_causal=True, scale=scale)):
        q.grad = None
        with flash():
            o = attn(q, k, v)
            o.backward(o.detach())  # a data-dependent upstream gradient
        got.append((o.detach().float(), q.grad.float()))
    return max((a - b).abs().max().item() for a, b in zip(*got))


def _kernel_split(fn) -> dict:
    """One profiled call of fn: GPU time in attention kernels (bench.KERNEL_KINDS), in all other kernels, and
    the number of kernels (trace_summary reads the trace)."""
    import tempfile

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function("ProfilerStep#1"):
            fn()
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        prof.export_chrome_trace(str(Path(d) / "trace.json"))
        summary = trace_summary(Path(d) / "trace.json")
    kinds = {k["kind"]: k["ms_per_step"] for k in summary["kinds"]}
    attention = kinds.pop("attention", 0.0)
    return {"attention_kernels_ms": attention, "other_kernels_ms": round(sum(kinds.values()), 3),
            "kernels": summary["steps"][0]["kernels"] if summary["steps"] else None}


def _ring_vs_fp32(ring, q, k, v) -> float:
    """Largest |difference| of output and gradients between the ring on bf16 inputs (flash blocks, fp32
    merges) and on the same inputs in fp32 (the math blocks): the fused path's arithmetic, checked."""
    got = []
    for dtype in (None, "fp32"):
        ins = [t.detach().float().requires_grad_() if dtype else t for t in (q, k, v)]
        for t in ins:
            t.grad = None
        o = ring(*ins)
        o.backward(o.detach())
        got.append([o.detach().float()] + [t.grad.float() for t in ins])
    return max((a - b).abs().max().item() for a, b in zip(*got))


def render_cp(target: str, rows: list[dict]) -> str:
    import torch

    b, n, seq, d, cp = cp_shapes(target)
    lines = [f"**{target}** (micro-batch {b}, {n} heads of {d}, sequence {seq}; its CP: {cp}) on "
             f"{torch.cuda.get_device_name()}, torch {torch.__version__}: one rank's attention per layer, megalab's ring "
             "(transfers replaced by local copies) against 1/CP of one flash-attention call over the whole sequence.", "",
             "| CP | tokens per rank | ideal fwd ms | ring fwd ms | ring / ideal | ideal fwd+bwd ms | ring fwd+bwd ms "
             "| ring / ideal | ring's flash kernels ms | its other kernels ms | kernels |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['cp']} | {r['tokens_per_rank']} | {r['ideal_fwd_ms']} | {r['ring_fwd_ms']} | "
              f"{r['ring_fwd_ms'] / r['ideal_fwd_ms']:.2f} | {r['ideal_fwd_bwd_ms']} | {r['ring_fwd_bwd_ms']} | "
              f"{r['ring_fwd_bwd_ms'] / r['ideal_fwd_bwd_ms']:.2f} | {r.get('attention_kernels_ms', '')} | "
              f"{r.get('other_kernels_ms', '')} | {r.get('kernels', '')} |" for r in rows]
    lines += ["\nKernel times from one profiled forward+backward (fwd+bwd columns): `other` includes the local copies "
              "that stand in for the ring's transfers."]
    lines += [f"\nCP>1, the bf16 ring (flash blocks) against the same ring in fp32 (math blocks): largest |difference| "
              f"of output and gradients {max(r['max_abs_diff_vs_fp32'] for r in rows if 'max_abs_diff_vs_fp32' in r):.1e}"
              ] if any("max_abs_diff_vs_fp32" in r for r in rows) else []
    lines += [f"\nCP=1 (the ring as plain causal attention) against one SDPA call: largest |difference| of output and "
              f"query gradient {r['max_abs_diff_vs_flash']:.1e}" for r in rows if "max_abs_diff_vs_flash" in r]
    return "\n".join(lines)


# --------------------------------------------------------------------------- trace reading
def _merge(intervals: list[tuple[float, float]]) -> float:
    """Total length of a union of [start, end) intervals."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


# Kernel kinds, first match wins (names as CUDA, cuBLAS, cuDNN and PyTorch print them): where a step's
# GPU time goes, in the groups that suggest a remedy (faster GEMMs, fused attention, a fused optimizer,
# fused norms/elementwise, fewer copies, overlapped communication).
KERNEL_KINDS = (
    ("communication", re.compile(r"nccl", re.I)),
    ("attention", re.compile(r"flash|fmha|cudnn.*(attn|sdpa)|attention|sdpa", re.I)),
    ("GEMM", re.compile(r"gemm|cutlass|xmma|nvjet|sm\d+_.*(tn|nt|nn)|matmul", re.I)),
    ("optimizer", re.compile(r"adam|multi_tensor|foreach|fused_.*optim", re.I)),
    ("norm", re.compile(r"layer_?norm|rms_?norm|batch_?norm|welford", re.I)),
    ("loss / softmax", re.compile(r"softmax|cross_?entropy|log_?softmax|nll", re.I)),
    ("copy / memset", re.compile(r"memcpy|memset|copy|cat_|concat|transpose", re.I)),
)


def kernel_kind(name: str, cat: str = "kernel") -> str:
    """The KERNEL_KINDS group of a profiler GPU event (memcpy/memset events by their category)."""
    if cat in ("gpu_memcpy", "gpu_memset"):
        return "copy / memset"
    return next((kind for kind, pat in KERNEL_KINDS if pat.search(name)), "elementwise / other")


def _trace_events(path: Path) -> list[dict]:
    """A torch profiler trace's events, through the file door (no FIFO, no bomb); BenchError with the fix."""
    try:
        events = json.loads(infile.read(path, infile.LOG_LIMIT))["traceEvents"]
        if not all(isinstance(e, dict) for e in events):
            raise TypeError("an event is not an object")
        return events
    except (ValueError, KeyError, TypeError) as e:
        raise BenchError(f"bench: {path}: not a torch profiler trace ({type(e).__name__}: {str(e)[:80]}); fix: "
                         "give the trace.json(.gz) of a profiled run (make profile-<id>)") from None


def _profiler_steps(events: list[dict]) -> list[tuple[str, tuple[float, float]]]:
    """The profiled steps (ProfilerStep#N) as (name, (start, end)) in time order, each from the host's
    timeline: the GPU's copy of a step (gpu_user_annotation) spans its kernels, not its wall time."""
    seen: dict[str, tuple[float, float]] = {}
    for e in events:
        if (e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
                and e.get("cat") != "gpu_user_annotation"):
            seen.setdefault(e["name"], (e["ts"], e["ts"] + e["dur"]))
    return sorted(seen.items(), key=lambda kv: kv[1])


def trace_summary(path: Path, top: int = 15) -> dict:
    """Per profiled step: wall time, GPU-busy time (union of kernels), and the costliest kernels.

    A step whose GPU is busy for much less than its wall time is bound by the host (Python,
    kernel launches, syncs), not by the GPU: fusing kernels or CUDA graphs pay there, faster
    kernels do not.
    """
    events = _trace_events(path)
    steps = [(s, e, name) for name, (s, e) in _profiler_steps(events)]
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    out = {"steps": [], "kernels": []}
    for s, e, name in steps:
        inside = [(max(k["ts"], s), min(k["ts"] + k["dur"], e)) for k in gpu if k["ts"] < e and k["ts"] + k["dur"] > s]
        out["steps"].append({"step": name, "wall_ms": round((e - s) / 1e3, 2),
                             "gpu_busy_ms": round(_merge(inside) / 1e3, 2), "kernels": len(inside)})
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for k in gpu:
        by_name[k["name"]][0] += k["dur"]
        by_name[k["name"]][1] += 1
    n = max(1, len(steps))
    kinds: dict[str, float] = defaultdict(float)
    for k in gpu:
        kinds[kernel_kind(str(k.get("name", "")), k.get("cat", ""))] += k["dur"]
    out["kinds"] = [{"kind": kind, "ms_per_step": round(dur / 1e3 / n, 2)}
                    for kind, dur in sorted(kinds.items(), key=lambda kv: -kv[1])]
    for name, (dur, count) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]:
        out["kernels"].append({"name": name[:90], "ms_per_step": round(dur / 1e3 / n, 2), "calls_per_step": count // n})
    return out


def host_gaps(path: Path, min_ms: float = 0.1) -> str:
    """Where the GPU waited for the host in a torch profiler trace: every idle gap longer than min_ms inside
    a profiled step, the CPU ops open on the launching thread at the launch that ended it (the "launch site"),
    the ops that ran during it, and the syncs just before it; then the idle time by launch site over all
    steps. What the kernel table cannot show: a step whose GPU is idle is sped up by the host, not the GPU."""
    ev = [e for e in _trace_events(path) if e.get("ph") == "X"]
    gpu = sorted((e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
    runtime = {e["args"]["correlation"]: e for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver")
               and "correlation" in (e.get("args") or {})}
    by_tid: dict = defaultdict(list)
    for e in ev:
        if e.get("cat") in ("cpu_op", "python_function", "user_annotation"):
            by_tid[e.get("tid")].append(e)
    syncs = [e for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver")
             and ("Synchronize" in e["name"] or "Memcpy" in e["name"])]
    total: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    out = []
    for name, (s0, s1) in _profiler_steps(ev):
        gaps, busy_end = [], s0
        for k in (k for k in gpu if s0 <= k["ts"] < s1):
            if k["ts"] - busy_end > min_ms * 1e3:
                gaps.append((busy_end, k["ts"], k))
            busy_end = max(busy_end, k["ts"] + k["dur"])
        if s1 - busy_end > min_ms * 1e3:
            gaps.append((busy_end, s1, None))
        idle = sum(g1 - g0 for g0, g1, _ in gaps) / 1e3
        out.append(f"## {name}: wall {(s1 - s0) / 1e3:.1f} ms, {len(gaps)} gaps > {min_ms} ms, idle {idle:.1f} ms")
        for g0, g1, k in gaps:
            launch = runtime.get((k.get("args") or {}).get("correlation")) if k else None
            tid = launch["tid"] if launch else None
            at = launch["ts"] if launch else g1
            stack = sorted((e for e in by_tid.get(tid, []) if e["ts"] <= at <= e["ts"] + e["dur"]),
                           key=lambda e: e["ts"]) if launch else []
            during: dict[str, float] = defaultdict(float)
            for e in by_tid.get(tid, []):  # the thread's work during the gap, by overlap
                ov = min(e["ts"] + e["dur"], g1) - max(e["ts"], g0)
                if ov > 0.05 * (g1 - g0) and e["dur"] < 20 * (g1 - g0):
                    during[e["name"][:90]] = max(during[e["name"][:90]], ov)
            wait = sorted({x["name"] for x in syncs if g0 - 100 <= x["ts"] + x["dur"] <= g1 and x["dur"] > 50})
            site = " > ".join(x["name"][:60] for x in stack[-4:]) or "(step end)"
            total[site] += (g1 - g0) / 1e3
            count[site] += 1
            out.append(f"- {(g1 - g0) / 1e3:6.2f} ms at +{(g0 - s0) / 1e3:7.1f}; "
                       f"next: {k['name'][:50] if k else 'step end'}")
            if wait:
                out.append(f"    waits before: {wait}")
            out.append(f"    launched from: {site}")
            out += [f"    during: {ov / 1e3:6.2f} ms {nm}" for nm, ov in sorted(during.items(), key=lambda kv: -kv[1])[:6]]
    out += ["", "## idle by launch site, all steps"]
    out += [f"{ms:8.2f} ms {count[site]:4d}x {site}" for site, ms in sorted(total.items(), key=lambda kv: -kv[1])[:30]]
    return "\n".join(out)


def render_trace(summary: dict) -> str:
    steps = [[s["step"], s["wall_ms"], s["gpu_busy_ms"],
              f"{100 * s['gpu_busy_ms'] / s['wall_ms'] if s['wall_ms'] else 0:.0f}", s["kernels"]] for s in summary["steps"]]
    kernels = [[k["name"], k["ms_per_step"], k["calls_per_step"]] for k in summary["kernels"]]
    kinds = [[k["kind"], k["ms_per_step"]] for k in summary.get("kinds", [])]
    return "\n".join([*markdown.table(["step", "wall ms", "GPU-busy ms", "busy %", "kernels"], steps), "",
                      *markdown.table(["kernel kind (bench.KERNEL_KINDS)", "ms/step"], kinds), "",
                      *markdown.table(["kernel", "ms/step", "calls/step"], kernels)])


def render_clocks(summary: list[dict]) -> str:
    """clocks.summary() as a table, one row per GPU."""
    rows = [[s["gpu"], f"{s['busy']} of {s['samples']}", clocks.mhz_cell(s),
             clocks.power_cell(s), clocks.held_cell(s)] for s in summary]
    return "\n".join(markdown.table(
        ["GPU", f"busy samples (util >= {clocks.BUSY_UTIL_PCT}%)", "SM MHz, median (range)", "power W, median",
         "clock held down by (share of busy samples)"], rows))


# --------------------------------------------------------------------------- the runs
class Runner:
    """Launches runs it has no record of yet, until its time budget is spent (resumable)."""

    def __init__(self, runs_dir: Path, budget_s: float | None, gpus: int):
        self.runs_dir, self.budget_s, self.gpus = runs_dir, budget_s, gpus
        self.start = time.monotonic()
        self.records = load_runs(runs_dir)
        self.out_of_time = False

    def get(self, run: Run) -> RunRecord | None:
        rec = self.records.get(run.key())
        if rec is not None:
            return rec
        if self.budget_s is not None and time.monotonic() - self.start > self.budget_s:
            self.out_of_time = True
            return None
        exp = run.experiment()
        if exp.gpus > self.gpus:
            return None
        opts = launch.Options.from_env()
        opts = dataclasses.replace(opts, spec=run.spec, fast=run.fast, cuda_graph=run.cuda_graph,
                                   iters=run.iters, extra_args=variables.parse("EXTRA_ARGS", run.extra_args),
                                   outdir=self.runs_dir,
                                   dry_run=False)
        print(f"bench: {run.label()}", flush=True)
        launch.run(exp.id, opts, exp=exp)
        self.records = load_runs(self.runs_dir)
        return self.records.get(run.key())


def search(runner: Runner, cfg: dict, spec_name: str) -> dict:
    """Bisection for the largest GBS that fits: `lo` known to fit (measured), `hi` not to."""
    s = cfg["search"]
    spec = cfg["specs"][spec_name]
    tried: dict[int, bool | None] = {}

    def probe(g: int) -> bool | None:
        rec = runner.get(make_run(cfg, s["target"], spec["spec"], s["levers"][spec_name], g))
        tried[g] = fits(rec)
        return tried[g]

    lo, hi = s["start"][spec_name], None
    if not probe(lo):
        return {"spec": spec_name, "largest": None, "tried": tried}
    g = lo
    while hi is None:  # double until something does not fit
        g = min(2 * g, s["up_to"] + 1)
        r = probe(g) if g <= s["up_to"] else False
        if r is None:
            return {"spec": spec_name, "largest": None, "tried": tried, "incomplete": True}
        if r:
            lo = g
        else:
            hi = g
    while hi - lo > 1:
        mid = (lo + hi) // 2
        r = probe(mid)
        if r is None:
            return {"spec": spec_name, "largest": None, "tried": tried, "incomplete": True}
        lo, hi = (mid, hi) if r else (lo, mid)
    return {"spec": spec_name, "largest": lo, "tried": tried}


def run_all(cfg: dict, runs_dir: Path, budget_s: float | None, parts: list[str]) -> Runner:
    import torch

    require_gpu()
    runner = Runner(runs_dir, budget_s, torch.cuda.device_count())
    for part in parts:  # in the order asked for, so a short budget goes to what matters most
        if part == "matmul" and not (runs_dir.parent / "matmul.json").exists():
            (runs_dir.parent / "matmul.json").write_text(json.dumps(matmul_tflops(), indent=1) + "\n")
        elif part == "cases":
            for case in cfg["cases"]:
                for spec_name in cfg["specs"]:
                    runner.get(spec_run(cfg, case, spec_name))
        elif part == "ablation":
            for _, _, run in ablation_runs(cfg):
                runner.get(run)
        elif part == "search":
            for spec_name in cfg["search"]["levers"]:
                search(runner, cfg, spec_name)
        elif part in ("parity", "experts"):
            for _, a, b in (parity_runs if part == "parity" else expert_runs)(cfg):
                runner.get(a)
                runner.get(b)
    return runner


PARTS = ("matmul", "cases", "ablation", "search", "parity", "experts")


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("matmul")
    w = sub.add_parser("wgrad", help="time fused_wgrad against Megatron's unfused accumulation, per linear shape")
    w.add_argument("target")
    c = sub.add_parser("cp", help="one rank's ring-attention compute against 1/CP of one flash call, per CP")
    c.add_argument("target")
    t = sub.add_parser("trace")
    t.add_argument("file", type=Path)
    g = sub.add_parser("gaps", help="where the GPU waited for the host in a profile trace, by launch site")
    g.add_argument("file", type=Path)
    g.add_argument("--min-ms", type=float, default=0.1, help="gaps shorter than this are not listed")
    k = sub.add_parser("clocks", help="a run's SM clock, power and what held its clock down, while the GPU was busy")
    k.add_argument("path", type=Path, metavar="RUN", help="the run directory (or its gpu_memory.csv)")
    r = sub.add_parser("run")
    r.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    r.add_argument("--budget-s", type=float, default=None,
                   help="start no new launch after this many seconds (run again to resume)")


def main(args: argparse.Namespace) -> int:
    """`python -m megalab bench matmul|wgrad|cp|trace|gaps|clocks|run` (make bench: run)."""
    try:
        if args.cmd == "run":
            parts = [x for x in args.parts.split(",") if x]
            bad = sorted(set(parts) - set(PARTS))
            if bad:
                raise BenchError(f"bench: unknown part(s) {bad}; fix: --parts from {','.join(PARTS)}")
            runner = run_all(load_config(), BENCH_DIR / "runs", args.budget_s, parts)
            # the page: `python -m megalab bench run` writes it next (results/benchreport.py)
            if runner.out_of_time:
                print("bench: time budget spent; run it again to measure the rest (finished runs are kept)")
        elif args.cmd == "matmul":
            print(json.dumps(matmul_tflops()))
        elif args.cmd == "wgrad":
            print(render_wgrad(args.target, wgrad_accum(args.target)))
        elif args.cmd == "cp":
            print(render_cp(args.target, cp_compute(args.target)))
        elif args.cmd == "trace":
            print(render_trace(trace_summary(args.file)))
        elif args.cmd == "gaps":
            print(host_gaps(args.file, args.min_ms))
        elif args.cmd == "clocks":
            print(render_clocks(clocks.summary(args.path)))
    except (BenchError, infile.InputError) as e:
        print(e, file=sys.stderr)
        return 2
    return 0

