"""Microbenchmark: bias_gelu's backward (megalab/runtime/bias_gelu.py) at other grids than the shipped one
(64 x 64 tiles, 4 warps, 4 programs an SM): more programs an SM, narrower tiles. Each way runs the lever's
forward and backward through autograd, the bias in an fp32 main_grad as in a run; the backward's time is
forward+backward less the forward (torch.profiler's kernel time, megalab/harness/bench.py kernel_us).

Run: python benchmarks/mb-bias-gelu-grid.py > results/bench/bias-gelu-grid-microbench.txt
"""
import torch

from megalab.harness.bench import kernel_us as gpu_us
from megalab.runtime import bias_gelu

SHAPES = [  # (what, tokens, 4h)
    ("GPT-2 XL MLP, row 111 (15 x 1024 tokens, 4 x 1600)", 15360, 6400),
    ("GPT-2 24 x 2048 MLP (not a catalog row; 15 x 1024 tokens, 4 x 2048)", 15360, 8192),
    ("GPT-2 XL MLP at micro-batch 14 (not a catalog row)", 14336, 6400),
]
WAYS = ((64, 64, 4, 4), (64, 64, 4, 8), (64, 64, 4, 16), (32, 64, 4, 8), (64, 32, 4, 8), (128, 64, 8, 4),
        (64, 128, 8, 4))  # (rows, cols, warps, programs an SM)


def main():
    props = torch.cuda.get_device_properties(0)
    print(torch.cuda.get_device_name(), getattr(props, "uuid", ""), f"{props.multi_processor_count} SMs")
    for what, rows, n in SHAPES:
        torch._dynamo.reset()
        y = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        b = torch.nn.Parameter((torch.randn(n, device="cuda") * 0.1).to(torch.bfloat16))
        b.main_grad = torch.zeros(n, device="cuda")
        b.grad_added_to_main_grad = False
        g = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
        print(f"{what}: the backward moves {3 * y.numel() * 2 / 1e6:.0f} MB ({3 * y.numel() * 2 / 3.35e6:.0f} us "
              f"at 3.35 TB/s)")
        for way in WAYS:
            bias_gelu.BLOCK_ROWS, bias_gelu.BLOCK_COLS, bias_gelu.WARPS, bias_gelu.PROGRAMS_PER_SM = way

            def step():
                y.grad = None
                bias_gelu.bias_gelu_impl(y, b).backward(g)

            f = gpu_us(lambda: bias_gelu.bias_gelu_impl(y, b))
            fb = gpu_us(step)
            print(f"  {way[0]} x {way[1]}, {way[2]} warps, {way[3]}/SM: backward ~{fb[0] - f[0]:6.1f} us "
                  f"({fb[1]:.0f} kernels a forward+backward)")
    bias_gelu.BLOCK_ROWS, bias_gelu.BLOCK_COLS, bias_gelu.WARPS, bias_gelu.PROGRAMS_PER_SM = WAYS[0]
    print(f"torch {torch.__version__}")


if __name__ == "__main__":
    main()
