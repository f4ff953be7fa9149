"""The MoE layer's six grouped GEMMs in the libraries that offer one, at row 510's shape (one GPU).

    python benchmarks/mb-moe-grouped-gemm.py [--tokens 16384] [--experts 64] [--topk 8] [--hidden 1024]
                                             [--ffn 1024] [--layers 16]

megalab's GroupedMLP (megalab/runtime/grouped_experts.py) runs torch's own `torch._grouped_mm` for each GEMM of an
expert MLP: fc1 and fc2 forward, their input gradients (dgrad) and their weight gradients (wgrad, one [out, in]
matrix an expert). This script times the same six GEMMs on the same routed tokens in each library that is present:

* `torch._grouped_mm` (what runs today; group offsets on the device, no host sync);
* grouped_gemm (github.com/tgale96/grouped_gemm, MegaBlocks' GEMMs): `grouped_gemm.backend.gmm`, built from its
  source; cuBLAS per expert by default, CUTLASS's grouped kernel when built with GROUPED_GEMM_CUTLASS=1. It takes
  the group sizes on the host, which costs a device-to-host sync a layer in a real step (not counted here);
* quack-kernels (CuTe-DSL GEMMs, the kernels sonic-moe is built on): `quack.gemm_interface.gemm` with
  `cu_seqlens_m` (forward, dgrad) and `cu_seqlens_k` (wgrad), offsets on the device.

A library that is absent prints one line that says so. The routing is top-k of random logits (what the row's forced
load balancing does), rows sorted by expert. Times are medians of triton.testing.do_bench (CUDA events). Each
result is checked against torch._grouped_mm's (largest |difference| over the largest |value|).
"""
from __future__ import annotations

import argparse
import importlib

import torch


def _bench(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")  # ms


def torch_impl(t):
    mm = torch._grouped_mm
    return {"fc1 forward": lambda: mm(t["x"], t["w1"].transpose(1, 2), offs=t["offs"]),
            "fc2 forward": lambda: mm(t["h"], t["w2"].transpose(1, 2), offs=t["offs"]),
            "fc2 dgrad": lambda: mm(t["dy2"], t["w2"], offs=t["offs"]),
            "fc2 wgrad": lambda: mm(t["dy2"].t(), t["h"], offs=t["offs"]),
            "fc1 dgrad": lambda: mm(t["dy1"], t["w1"], offs=t["offs"]),
            "fc1 wgrad": lambda: mm(t["dy1"].t(), t["x"], offs=t["offs"])}


def grouped_gemm_impl(t):
    from grouped_gemm import backend

    bs = t["counts"].cpu()  # the library's contract: group sizes on the host
    g = backend.gmm
    return {"fc1 forward": lambda: g(t["x"], t["w1"], bs, trans_b=True),
            "fc2 forward": lambda: g(t["h"], t["w2"], bs, trans_b=True),
            "fc2 dgrad": lambda: g(t["dy2"], t["w2"], bs),
            "fc2 wgrad": lambda: g(t["dy2"], t["h"], bs, trans_a=True),
            "fc1 dgrad": lambda: g(t["dy1"], t["w1"], bs),
            "fc1 wgrad": lambda: g(t["dy1"], t["x"], bs, trans_a=True)}


def quack_impl(t):
    from quack.gemm_interface import gemm

    cu = torch.cat([t["offs"].new_zeros(1), t["offs"]])  # (experts + 1) int32 on the device
    return {"fc1 forward": lambda: gemm(t["x"], t["w1"].transpose(1, 2), cu_seqlens_m=cu),
            "fc2 forward": lambda: gemm(t["h"], t["w2"].transpose(1, 2), cu_seqlens_m=cu),
            "fc2 dgrad": lambda: gemm(t["dy2"], t["w2"], cu_seqlens_m=cu),
            "fc2 wgrad": lambda: gemm(t["dy2"].t(), t["h"], cu_seqlens_k=cu),
            "fc1 dgrad": lambda: gemm(t["dy1"], t["w1"], cu_seqlens_m=cu),
            "fc1 wgrad": lambda: gemm(t["dy1"].t(), t["x"], cu_seqlens_k=cu)}


LIBRARIES = {"torch._grouped_mm (today)": ("torch", torch_impl), "grouped_gemm (MegaBlocks)": ("grouped_gemm", grouped_gemm_impl),
             "quack-kernels": ("quack", quack_impl)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--label", default="", help="a name for this build of the libraries (printed in the heading)")
    ap.add_argument("--repeat", type=int, default=1, help="time every GEMM this many times over, in this process")
    a = ap.parse_args()
    dev, bf = torch.device("cuda"), torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)
    expert = torch.randn(a.tokens, a.experts, device=dev, generator=gen).topk(a.topk, dim=1).indices.reshape(-1)
    counts = torch.bincount(expert, minlength=a.experts)
    rows = int(counts.sum())
    t = {"counts": counts, "offs": counts.cumsum(0).to(torch.int32)}
    for name, shape in (("x", (rows, a.hidden)), ("h", (rows, a.ffn)), ("dy2", (rows, a.hidden)),
                        ("dy1", (rows, a.ffn)), ("w1", (a.experts, a.ffn, a.hidden)),
                        ("w2", (a.experts, a.hidden, a.ffn))):
        t[name] = torch.randn(*shape, device=dev, dtype=bf, generator=gen) * 0.1
    flops = {n: 2 * rows * a.hidden * a.ffn for n in ("fc1 forward", "fc2 forward", "fc2 dgrad", "fc2 wgrad",
                                                      "fc1 dgrad", "fc1 wgrad")}
    heading = (f"# {torch.cuda.get_device_name()}, torch {torch.__version__}{' ' + a.label if a.label else ''}: "
               f"{a.tokens} tokens, top-{a.topk} of {a.experts} experts ({rows} routed rows; tokens an expert "
               f"{int(counts.min())}-{int(counts.max())}), hidden {a.hidden}, expert ffn {a.ffn}; ms a GEMM, and the "
               f"six times {a.layers} layers")
    fns_of = {}
    for label, (module, impl) in LIBRARIES.items():
        try:
            importlib.import_module(module)
            fns_of[label] = impl(t)
        except Exception as e:  # absent or unbuildable here: one line, the rest still runs
            print(f"{label}: not run ({type(e).__name__}: {str(e).splitlines()[0][:150] if str(e) else ''})")
    for r in range(a.repeat):  # the same GEMMs timed again in this process (an autotuner tunes once)
        if a.repeat > 1:
            print(f"## run {r + 1} of {a.repeat}, one process")
        print(heading)
        _table(fns_of, flops, a.layers)


def _table(fns_of: dict, flops: dict, layers: int) -> None:
    """Each library's six GEMMs timed, each result checked against the first library's, and the table."""
    want, table = None, {}
    for label, fns in fns_of.items():
        row = {}
        for name, fn in fns.items():
            try:
                out = fn()
                torch.cuda.synchronize()
                if want is not None:
                    ref = want[name]
                    err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
                else:
                    err = 0.0
                    want_row = row.setdefault("_out", {})
                    want_row[name] = out
                row[name] = (_bench(fn), err)
                print(f"  {label}, {name}: {row[name][0]:.3f} ms", flush=True)  # as it goes: autotuners are slow
            except Exception as e:
                row[name] = (None, f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}")
        if want is None:
            want = row.pop("_out")
        table[label] = row
    names = list(flops)
    print("| library | " + " | ".join(names) + f" | six GEMMs | x {layers} layers | TFLOP/s |")
    print("| --- " * (len(names) + 4) + "|")
    for label, row in table.items():
        cells, total = [], 0.0
        for n in names:
            ms, err = row[n]
            if ms is None:
                cells.append(f"failed ({err})")
                total = None
                continue
            cells.append(f"{ms:.3f}" + (f" (err {err:.0e})" if err else ""))
            total = None if total is None else total + ms
        tail = ("", "", "") if total is None else (f"{total:.3f}", f"{total * layers:.1f}",
                                                   f"{sum(flops.values()) / total / 1e9:.0f}")
        print(f"| {label} | " + " | ".join(cells) + " | " + " | ".join(tail) + " |", flush=True)


if __name__ == "__main__":
    main()
