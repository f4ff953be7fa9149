"""The MoE levers' kernels at row 510's shape, against the torch arithmetic they replace (one GPU).

    python benchmarks/moe_kernels.py [--tokens 16384] [--topk 8] [--hidden 1024] [--ffn 1024]

moe_act (megalab/runtime/moe_act.py): Megatron's `(gelu(h) * probs).to(bf16)` and its backward against one Triton
kernel each way, for a few tiles; moe_gather's sum of each token's k rows (megalab/runtime/moe_dispatch.py) against
a gather and a sum. Times are medians of triton.testing.do_bench (CUDA events), in microseconds, with the bytes each
version must move at least and the bandwidth that implies.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F


def _bench(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3  # us


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=1024)
    a = ap.parse_args()
    from megalab.runtime import moe_act, moe_dispatch

    dev = torch.device("cuda")
    rows = a.tokens * a.topk
    h = torch.randn(rows, a.ffn, device=dev, dtype=torch.bfloat16)
    p = torch.rand(rows, device=dev, dtype=torch.float32)
    dy = torch.randn_like(h)
    gb = rows * a.ffn * 2 / 1e9
    print(f"moe_act at [{rows}, {a.ffn}] bf16: forward moves >= {2 * gb:.3f} GB, backward >= {3 * gb:.3f} GB")

    def torch_fwd():
        return (F.gelu(h) * p.unsqueeze(-1)).to(h.dtype)

    hh, pp = h.clone().requires_grad_(), p.clone().requires_grad_()
    y = (F.gelu(hh) * pp.unsqueeze(-1)).to(h.dtype)
    print(f"  torch     forward {_bench(torch_fwd):8.1f} us   backward "
          f"{_bench(lambda: torch.autograd.grad(y, (hh, pp), dy, retain_graph=True)):8.1f} us")
    for block_rows, warps in ((4, 4), (8, 4), (8, 8), (16, 4), (16, 8), (32, 8)):
        moe_act.BLOCK_ROWS, moe_act.WARPS = block_rows, warps
        y2 = moe_act.weighted_gelu(hh, pp)
        f = _bench(lambda: moe_act.weighted_gelu(h, p))
        b = _bench(lambda: torch.autograd.grad(y2, (hh, pp), dy, retain_graph=True))
        print(f"  triton {block_rows:2d} rows {warps} warps: forward {f:8.1f} us ({2 * gb / f * 1e6:6.0f} GB/s)   "
              f"backward {b:8.1f} us ({3 * gb / b * 1e6:6.0f} GB/s)")

    x = torch.randn(rows, a.hidden, device=dev, dtype=torch.bfloat16)
    rows_of_token = torch.randperm(rows, device=dev).view(a.tokens, a.topk)
    gb = rows * a.hidden * 2 / 1e9
    print(f"gather_sum of [{rows}, {a.hidden}] into [{a.tokens}, {a.hidden}]: moves >= {gb * (1 + 1 / a.topk):.3f} GB")
    t = _bench(lambda: x.index_select(0, rows_of_token.reshape(-1)).view(a.tokens, a.topk, a.hidden).sum(1))
    print(f"  torch gather + sum         {t:8.1f} us")
    for bt, bh in ((8, 256), (16, 256), (16, 512), (32, 256), (64, 128)):
        moe_dispatch.BLOCK_T, moe_dispatch.BLOCK_H = bt, bh
        t = _bench(lambda: moe_dispatch.gather_sum(x, rows_of_token))
        print(f"  triton {bt:2d} x {bh:3d}              {t:8.1f} us ({gb * (1 + 1 / a.topk) / t * 1e6:6.0f} GB/s)")


if __name__ == "__main__":
    main()
