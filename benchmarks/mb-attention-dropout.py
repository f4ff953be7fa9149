"""Microbenchmark: PyTorch's SDPA backends at row 111's attention (GPT-2 XL: 15 x 1024 tokens, 25 heads of 64,
causal), with attention dropout 0.1 as the model has it and without, forward and forward+backward. Q, K and V
are views of one QKV projection's output laid out as Megatron's ([s, b, heads, 3 x 64], split per head), and
megalab's SDPAttention permutes them to [b, heads, s, 64]: so the backward includes the copy that joins dQ, dK
and dV back into the projection's gradient, as in a run.

Why: the attention takes 46-53 ms of row 111's 346 ms GPU step (cudnn_sdpa puts cuDNN first); with dropout,
the kernels run at a fraction of their dropout-free speed. This says which backend is quickest at this shape.

Run: python benchmarks/mb-attention-dropout.py > results/bench/attention-dropout-microbench.txt
"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from megalab.harness.bench import kernel_us

SHAPES = [  # (what, s, b, heads, head dim)
    ("GPT-2 XL, row 111 (15 x 1024 tokens, 25 heads of 64)", 1024, 15, 25, 64),
    ("GPT-2 24 x 2048 (not a catalog row; 15 x 1024 tokens, 16 heads of 128)", 1024, 15, 16, 128),
]
BACKENDS = [("cuDNN", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
            ("memory-efficient", SDPBackend.EFFICIENT_ATTENTION)]


def main():
    print(torch.cuda.get_device_name(), getattr(torch.cuda.get_device_properties(0), "uuid", ""))
    for what, s, b, heads, d in SHAPES:
        qkv = torch.randn(s, b, heads, 3 * d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(b, heads, s, d, device="cuda", dtype=torch.bfloat16)
        causal_flops = 4 * b * heads * s * s * d / 2  # forward; backward 2.5x
        print(f"{what}: forward {causal_flops / 1e12:.2f} TFLOP (causal), backward 2.5x that")
        for p in (0.1, 0.0):
            for name, backend in BACKENDS:
                def fwd():
                    q, k, v = (t.permute(1, 2, 0, 3) for t in torch.split(qkv, d, dim=-1))
                    return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)

                def both():
                    qkv.grad = None
                    fwd().backward(dy)

                try:
                    with sdpa_kernel([backend]):
                        f, fb = (kernel_us(g, reps=10, warmup=3)[0] / 1e3 for g in (fwd, both))
                except RuntimeError as e:
                    print(f"  dropout {p}: {name:17s} not available here ({str(e).splitlines()[0][:80]})")
                    continue
                print(f"  dropout {p}: {name:17s} forward {f:6.3f} ms ({causal_flops / f / 1e9:4.0f} TFLOP/s), "
                      f"forward+backward {fb:6.3f} ms ({3.5 * causal_flops / fb / 1e9:4.0f} TFLOP/s); "
                      f"x48 layers: {48 * fb:5.1f} ms a step")
    print(f"torch {torch.__version__}")


if __name__ == "__main__":
    main()
