"""Microbenchmark behind triton_norm (megalab/runtime/triton_norm.py), on one GPU: one norm's forward and
backward (input, weight and bias gradients) at the shapes of the catalog's one-GPU rows and two that are not
catalog rows, four ways: torch's kernels, torch.compile's, liger-kernel's (the liger_norm lever; where it imports) and
megalab's Triton kernels, the last at several backward grid sizes (programs per SM, and rows a program takes at
least).

Two times per way: the GPU's (the kernels' own time, summed by torch.profiler) and the wall time per call in a
loop without syncs (the host's time where it is slower than the kernels; a CUDA graph or a GPU-bound step
hides it). The ideal is the bytes each way must move (forward: read x, write y; backward: read x and dy,
write dx) at the GPU's memory speed.

Run: python benchmarks/mb-triton-norm.py > results/bench/norm-libraries-microbench.txt
"""
import importlib.util
import sys

import torch
import torch.nn.functional as F

from megalab.harness.bench import kernel_us as gpu_us, ms_per_call
from megalab.runtime import liger_norm, triton_norm

SHAPES = [  # (what, [s, b, h], RMSNorm?)
    ("GPT-2 XL LayerNorm, row 111 (15 x 1024 tokens)", (1024, 15, 1600), False),
    ("GPT-2 1.2B LayerNorm, row 221 (20 x 1024 tokens)", (1024, 20, 1536), False),
    ("GPT-2 XL LayerNorm, row 101 (1 x 1024 tokens)", (1024, 1, 1600), False),
    ("Llama-style RMSNorm, row 600 (1 x 2048 tokens)", (2048, 1, 2048), True),
    ("GPT-2 24 x 2048 LayerNorm (not a catalog row; 15 x 1024 tokens)", (1024, 15, 2048), False),
    ("Llama-style RMSNorm, 8 x 2560 (not a catalog row; 2 x 2048 tokens)", (2048, 2, 2560), True),
]
# (triton_norm.PROGRAMS_PER_SM, MIN_ROWS) tried; `--grids` tries the others (triton-norm-microbench.txt has them)
GRIDS = ((2, 8), (4, 1), (4, 8), (4, 16), (8, 8), (16, 8)) if "--grids" in sys.argv else (
    (triton_norm.PROGRAMS_PER_SM, triton_norm.MIN_ROWS),)


def main():
    props = torch.cuda.get_device_properties(0)
    print(torch.cuda.get_device_name(), getattr(props, "uuid", ""), f"{props.multi_processor_count} SMs")
    for what, shape, rms in SHAPES:
        h = shape[-1]
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = (torch.rand(h, device="cuda") + 0.5).to(torch.bfloat16).requires_grad_()
        b = None if rms else (torch.randn(h, device="cuda") * 0.1).to(torch.bfloat16).requires_grad_()
        dy = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        ways = {
            "torch": lambda: F.rms_norm(x, (h,), w, 1e-5) if rms else F.layer_norm(x, (h,), w, b, 1e-5),
            "compiled": lambda: compiled(x, (h,), w, 1e-5) if rms else compiled(x, (h,), w, b, 1e-5),
            "liger": lambda: liger_norm.norm(x, w, b, 1e-5, rms, False),
            "triton": lambda: triton_norm.norm(x, w, b, 1e-5, rms, False),
        }
        compiled = torch.compile(F.rms_norm if rms else F.layer_norm, dynamic=False)
        if importlib.util.find_spec("liger_kernel") is None:
            del ways["liger"]

        def step(fn):  # fresh gradients each time: no accumulate kernel on either side
            for t in (x, w, b):
                if t is not None:
                    t.grad = None
            fn().backward(dy)

        def grads(fn):
            step(fn)
            return [t.grad.float() for t in (x, w, b) if t is not None]

        fwd_bytes, bwd_bytes = 4 * x.numel(), 6 * x.numel()
        print(f"{what}: forward moves {fwd_bytes / 1e6:.0f} MB, backward {bwd_bytes / 1e6:.0f} MB "
              f"(at an H100 SXM datasheet 3.35 TB/s: {fwd_bytes / 3.35e6:.0f} + {bwd_bytes / 3.35e6:.0f} us)")
        want_y, want_g = ways["torch"]().float(), grads(ways["torch"])
        for name, fn in ways.items():
            grids = GRIDS if name == "triton" else (None,)
            for grid in grids:
                if grid is not None:
                    triton_norm.PROGRAMS_PER_SM, triton_norm.MIN_ROWS = grid
                f, fb = gpu_us(fn), gpu_us(lambda: step(fn))
                fw, fbw = ms_per_call(fn, 50, 5) * 1e3, ms_per_call(lambda: step(fn), 50, 5) * 1e3
                dy_ = (fn().float() - want_y).abs().max().item()
                dg = [(a - c).abs().max().item() for a, c in zip(grads(fn), want_g)]
                label = name if grid is None else f"{name} ({grid[0]}/SM, >={grid[1]} rows)"
                print(f"  {label:26s} GPU forward {f[0]:6.0f} us ({f[1]:.0f} kernels), forward+backward {fb[0]:6.0f} us "
                      f"({fb[1]:.0f}); wall/call {fw:5.0f} / {fbw:5.0f} us; largest difference from torch: y {dy_:.3g}, "
                      f"grads {', '.join(f'{d:.3g}' for d in dg)}")
    print(f"torch {torch.__version__}")


if __name__ == "__main__":
    main()
