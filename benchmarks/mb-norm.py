"""Microbenchmark behind compiled_norm (megalab/runtime/norm.py), on one GPU: one norm's forward and backward
(input, weight and bias gradients) at the shapes of the catalog's one-GPU rows, torch's kernels against the
kernels torch.compile generates for the same math.

  GPT-2 XL, row 111 : LayerNorm over [1024, 15, 1600] bf16 (97 norms a micro-batch);
  GPT-2 1.2B, 221   : LayerNorm over [1024, 20, 1536];
  GPT-2 XL, row 101 : LayerNorm over [1024, 1, 1600];
  Llama-style, 600  : RMSNorm over [2048, 1, 2048] (33 a micro-batch); 8 x 2560 (not a catalog row): [2048, 2, 2560].

Two times per way: the GPU's (the kernels' own time, summed by torch.profiler) and the wall time per call in a
loop without syncs, which is the host's time where the host is slower than the kernels (torch.compile's wrapper
adds host work per call; a CUDA graph or a GPU-bound step hides it).

Run: python benchmarks/mb-norm.py > results/bench/norm-microbench.txt
"""
import torch
import torch.nn.functional as F

from megalab.harness.bench import kernel_us as gpu_us, ms_per_call
from megalab.runtime import norm

SHAPES = [  # (what, [s, b, h], RMSNorm?)
    ("GPT-2 XL LayerNorm, row 111 (15 x 1024 tokens)", (1024, 15, 1600), False),
    ("GPT-2 1.2B LayerNorm, row 221 (20 x 1024 tokens)", (1024, 20, 1536), False),
    ("GPT-2 XL LayerNorm, row 101 (1 x 1024 tokens)", (1024, 1, 1600), False),
    ("Llama-style RMSNorm, row 600 (1 x 2048 tokens)", (2048, 1, 2048), True),
    ("Llama-style RMSNorm, 8 x 2560 (2 x 2048 tokens)", (2048, 2, 2560), True),
]


def main():
    props = torch.cuda.get_device_properties(0)
    print(torch.cuda.get_device_name(), getattr(props, "uuid", ""))
    for what, shape, rms in SHAPES:
        h = shape[-1]
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = (torch.rand(h, device="cuda") + 0.5).to(torch.bfloat16).requires_grad_()
        b = None if rms else (torch.randn(h, device="cuda") * 0.1).to(torch.bfloat16).requires_grad_()
        dy = torch.randn(shape, device="cuda", dtype=torch.bfloat16)

        def eager():
            return F.rms_norm(x, (h,), w, 1e-5) if rms else F.layer_norm(x, (h,), w, b, 1e-5)

        def compiled():
            return norm.compiled(x, w, b, 1e-5, rms, False)

        def step(fn):  # fresh gradients each time: no accumulate kernel on either side
            for t in (x, w, b):
                if t is not None:
                    t.grad = None
            fn().backward(dy)

        row = []
        for fn in (eager, compiled):
            row.append((gpu_us(lambda: fn()), gpu_us(lambda: step(fn)), ms_per_call(lambda: fn(), 50, 5) * 1e3,
                        ms_per_call(lambda: step(fn), 50, 5) * 1e3))
        ye, yc = eager(), compiled()
        diff = (ye.float() - yc.float()).abs().max().item()
        (tf, tb, tfw, tbw), (cf, cb, cfw, cbw) = row
        print(f"{what}:")
        print(f"  GPU time  forward torch {tf[0]:5.0f} us ({tf[1]:.0f} kernels), compiled {cf[0]:5.0f} us ({cf[1]:.0f}); "
              f"forward+backward torch {tb[0]:5.0f} us ({tb[1]:.0f}), compiled {cb[0]:5.0f} us ({cb[1]:.0f}): "
              f"{tb[0] / cb[0]:.2f}x")
        print(f"  wall/call forward torch {tfw:5.0f} us, compiled {cfw:5.0f} us; forward+backward torch {tbw:5.0f} us, "
              f"compiled {cbw:5.0f} us")
        print(f"  forward reads and writes {4 * x.numel() / 1e6:.0f} MB: {4 * x.numel() / cf[0] / 1e6:.2f} TB/s "
              f"compiled, {4 * x.numel() / tf[0] / 1e6:.2f} TB/s torch; largest output difference {diff:.3g}")
    print(f"torch {torch.__version__}")


if __name__ == "__main__":
    main()
