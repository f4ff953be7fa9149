"""Microbenchmark behind bias_gelu (megalab/runtime/bias_gelu.py), on one GPU: the MLP's bias-GeLU forward and
backward (input and bias gradients) at the shapes of the catalog's one-GPU GPT-2 rows and two that are not catalog
rows, two ways: Megatron's (its compiled bias_gelu and bias_gelu_back, then autograd's sum of the bias's copy) and
megalab's Triton backward with the bias's sum in the same kernel, the latter at several tile shapes. Then one
LayerNorm's forward and backward with triton_norm's weight and bias gradients as autograd takes them against added
straight into an fp32 main_grad (megalab/runtime/param_grad.py), Megatron's hook's add included on the first side.

Megatron's bias_gelu and bias_gelu_back are torch.compile'd: torch recompiles them for each new shape and, from
the second, for any shape (slower kernels). A run sees one shape, so each shape here starts from a fresh compile
cache (torch._dynamo.reset()), as a run does.

GPU time per call: the kernels' own time, summed by torch.profiler (megalab/harness/bench.py kernel_us). The ideal
is the bytes the backward must move (read the gradient and the saved input, write the input gradient) at the GPU's
memory speed.

Run: python benchmarks/mb-bias-gelu.py > results/bench/bias-gelu-microbench.txt
"""
import torch
import torch.nn.functional as F

from megalab.harness.bench import kernel_us as gpu_us
from megalab.runtime import bias_gelu, triton_norm

SHAPES = [  # (what, [s, b, 4h])
    ("GPT-2 XL MLP, row 111 (15 x 1024 tokens, 4 x 1600)", (1024, 15, 6400)),
    ("GPT-2 1.2B MLP, row 221 (20 x 1024 tokens, 4 x 1536)", (1024, 20, 6144)),
    ("GPT-2 XL MLP, row 101 (1 x 1024 tokens)", (1024, 1, 6400)),
    ("GPT-2 24 x 2048 MLP (not a catalog row; 15 x 1024 tokens, 4 x 2048)", (1024, 15, 8192)),
    ("GPT-2 XL MLP at micro-batch 14 (not a catalog row)", (1024, 14, 6400)),
]
TILES = ((32, 128, 4), (16, 128, 4), (16, 256, 4), (32, 128, 8), (64, 64, 4), (32, 64, 4))  # (rows, cols, warps)


def main():
    from megatron.core.fusions import fused_bias_gelu as M

    props = torch.cuda.get_device_properties(0)
    print(torch.cuda.get_device_name(), getattr(props, "uuid", ""), f"{props.multi_processor_count} SMs")
    for what, shape in SHAPES:
        torch._dynamo.reset()  # Megatron's kernels compiled for this shape alone, as in a run
        n = shape[-1]
        y = torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        b = (torch.randn(n, device="cuda") * 0.1).to(torch.bfloat16).requires_grad_()
        g = torch.randn(shape, device="cuda", dtype=torch.bfloat16)

        def step(fn):
            y.grad = b.grad = None
            fn(y, b).backward(g)

        def grads(fn):
            step(fn)
            return y.grad.float(), b.grad.float()

        moved = 6 * y.numel()
        print(f"{what}: backward moves {moved / 1e6:.0f} MB (at an H100 SXM datasheet 3.35 TB/s: "
              f"{moved / 3.35e6:.0f} us)")
        want = grads(M.bias_gelu_impl)
        ways = [("Megatron", M.bias_gelu_impl, None)] + [("triton", bias_gelu.BiasGeLU.apply, t) for t in TILES]
        for name, fn, tile in ways:
            if tile is not None:
                bias_gelu.BLOCK_ROWS, bias_gelu.BLOCK_COLS, warps = tile
                bias_gelu.WARPS = warps
            f, fb = gpu_us(lambda: fn(y, b)), gpu_us(lambda: step(fn))
            dx, db = grads(fn)
            label = name if tile is None else f"{name} ({tile[0]} x {tile[1]}, {tile[2]} warps)"
            print(f"  {label:28s} GPU forward {f[0]:6.0f} us, forward+backward {fb[0]:6.0f} us ({fb[1]:.0f} kernels), "
                  f"backward ~{fb[0] - f[0]:6.0f} us; largest difference from Megatron: dx "
                  f"{(dx - want[0]).abs().max().item():.3g}, dbias {(db - want[1]).abs().max().item():.3g}")
    bias_gelu.BLOCK_ROWS, bias_gelu.BLOCK_COLS, bias_gelu.WARPS = TILES[0]

    print("LayerNorm (triton_norm), GPT-2 XL at row 111: the weight and bias gradients for autograd, then "
          "Megatron's hook's fp32 add, against straight into main_grad")
    x = torch.randn(1024, 15, 1600, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    for into in (False, True):
        w = torch.nn.Parameter((torch.rand(1600, device="cuda") + 0.5).to(torch.bfloat16))
        bb = torch.nn.Parameter(torch.zeros(1600, device="cuda", dtype=torch.bfloat16))
        for p in (w, bb):
            p.main_grad = torch.zeros(1600, device="cuda")
            if into:
                p.grad_added_to_main_grad = False

        def run():
            x.grad = w.grad = bb.grad = None
            triton_norm.norm(x, w, bb, 1e-5, False, False).backward(dy)
            if not into:  # Megatron's hook: the bf16 gradient added into main_grad
                for p in (w, bb):
                    p.main_grad.add_(p.grad)

        t = gpu_us(run)
        print(f"  {'into main_grad' if into else 'autograd + hook'}: forward+backward {t[0]:6.0f} us ({t[1]:.0f} kernels)")
    print(f"torch {torch.__version__}")


if __name__ == "__main__":
    main()
