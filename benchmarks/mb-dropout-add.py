"""Microbenchmark behind dropout_add (megalab/runtime/dropout_add.py), on one GPU: a layer's bias-dropout-add,
residual + dropout(x + bias, 0.1), forward and backward (input, bias and residual gradients) at the shapes of the
catalog's one-GPU GPT-2 rows and two that are not catalog rows, two ways: Megatron's (bias_dropout_add_fused_train,
torch.compile'd: a saved byte mask, then autograd's sum of the bias's copy) and megalab's Triton kernels (the mask
drawn again in the backward, the bias's sum in its kernel), the latter at several tile shapes. Also the kept
fraction of megalab's mask and the activation memory each way keeps for the backward.

Megatron's function is torch.compile'd: each shape starts from a fresh compile cache (torch._dynamo.reset()), as a
run does. GPU time per call: the kernels' own time, summed by torch.profiler (megalab/harness/bench.py kernel_us).
The ideal is the bytes each must move (forward: read x and residual, write out; backward: read the output's
gradient, write the input's) at an H100 SXM's datasheet 3.35 TB/s.

Run: python benchmarks/mb-dropout-add.py > results/bench/dropout-add-microbench.txt
"""
import torch

from megalab.harness.bench import kernel_us as gpu_us
from megalab.runtime import dropout_add

SHAPES = [  # (what, [s, b, h])
    ("GPT-2 XL, row 111 (15 x 1024 tokens, hidden 1600)", (1024, 15, 1600)),
    ("GPT-2 1.2B, row 221 (20 x 1024 tokens, hidden 1536)", (1024, 20, 1536)),
    ("GPT-2 XL, row 101 (1 x 1024 tokens)", (1024, 1, 1600)),
    ("GPT-2 24 x 2048 (not a catalog row; 15 x 1024 tokens, hidden 2048)", (1024, 15, 2048)),
    ("GPT-2 XL at micro-batch 14 (not a catalog row)", (1024, 14, 1600)),
]
# (row groups of 4 rows, columns, warps, backward tiles a program)
TILES = ((8, 128, 4, 2), (8, 128, 4, 1), (8, 128, 4, 4), (16, 128, 4, 2), (8, 64, 4, 2))
P = 0.1


def saved_bytes(fn, x, b, r) -> int:
    """Bytes autograd keeps for the backward of one call (what the saved-tensor hooks see)."""
    seen = {}

    def pack(t):
        seen[t.data_ptr()] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn((x, b), r, P)
    return sum(seen.values())


def main():
    from megatron.core.fusions import fused_bias_dropout as M

    props = torch.cuda.get_device_properties(0)
    print(torch.cuda.get_device_name(), getattr(props, "uuid", ""), f"{props.multi_processor_count} SMs")
    for what, shape in SHAPES:
        torch._dynamo.reset()  # Megatron's kernel compiled for this shape alone, as in a run
        n = shape[-1]
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        r = torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        b = (torch.randn(n, device="cuda") * 0.1).to(torch.bfloat16).requires_grad_()
        g = torch.randn(shape, device="cuda", dtype=torch.bfloat16)

        def step(fn):
            x.grad = r.grad = b.grad = None
            fn((x, b), r, P).backward(g)

        el = x.element_size() * x.numel()
        print(f"{what}: forward moves {3 * el / 1e6:.0f} MB ({3 * el / 3.35e6:.0f} us at 3.35 TB/s), backward "
              f"{2 * el / 1e6:.0f} MB ({2 * el / 3.35e6:.0f} us)")
        ways = [("Megatron", M.bias_dropout_add_fused_train, None)]
        ways += [("triton", dropout_add.bias_dropout_add_train, t) for t in TILES]
        for name, fn, tile in ways:
            if tile is not None:
                (dropout_add.ROW_GROUPS, dropout_add.BLOCK_COLS, dropout_add.WARPS,
                 dropout_add.TILES_PER_PROGRAM) = tile
            f, fb = gpu_us(lambda: fn((x, b), r, P)), gpu_us(lambda: step(fn))
            with torch.no_grad():
                kept = (fn((torch.ones_like(x), None), torch.zeros_like(r), P) != 0).float().mean().item()
            label = name if tile is None else f"{name} ({4 * tile[0]} x {tile[1]}, {tile[2]} warps, {tile[3]} a program)"
            print(f"  {label:40s} GPU forward {f[0]:6.0f} us, forward+backward {fb[0]:6.0f} us ({fb[1]:.0f} kernels), "
                  f"backward ~{fb[0] - f[0]:6.0f} us; kept {kept:.4f}; saved for backward "
                  f"{saved_bytes(fn, x, b, r) / 1e6:.1f} MB")
    dropout_add.ROW_GROUPS, dropout_add.BLOCK_COLS, dropout_add.WARPS, dropout_add.TILES_PER_PROGRAM = TILES[0]
    print(f"torch {torch.__version__}")


if __name__ == "__main__":
    main()
