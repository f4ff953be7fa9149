"""SDPA forward and forward+backward at row 510's attention ([s, b, n, h] = [4096, 4, 16, 64] permuted to [b, n, s, h]),
causal, per backend (cuDNN, flash, memory-efficient), with the model's attention dropout 0.1 and without.
Written to results/bench/sdpa-backends-microbench.txt. Usage: python benchmarks/mb-sdpa-backends.py"""
import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
torch.manual_seed(0)
s, b, n, h = 4096, 4, 16, 64
def bench(backend, p):
    q, k, v = (torch.randn(s, b, n, h, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    qq, kk, vv = (t.permute(1, 2, 0, 3) for t in (q, k, v))
    dy = torch.randn(b, n, s, h, device="cuda", dtype=torch.bfloat16)
    try:
        with sdpa_kernel([backend]):
            for _ in range(3):
                F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, dropout_p=p).backward(dy)
            torch.cuda.synchronize()
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            ev[0].record()
            for _ in range(20):
                o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, dropout_p=p)
            ev[1].record()
            for _ in range(20):
                F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, dropout_p=p).backward(dy)
            ev[2].record(); torch.cuda.synchronize()
            f = ev[0].elapsed_time(ev[1]) / 20; fb = ev[1].elapsed_time(ev[2]) / 20
            print(f"{backend.name:20s} dropout {p}: fwd {f:.3f} ms  fwd+bwd {fb:.3f} ms  x16 layers {16*fb:.1f} ms", flush=True)
    except Exception as e:
        print(f"{backend.name:20s} dropout {p}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
for p in (0.1, 0.0):
    for be in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        bench(be, p)
