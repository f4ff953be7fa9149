# microbench: Megatron's vocab_parallel_cross_entropy vs megalab's bf16 one (111's logits), and QKV matmul+bias vs addmm
import os, statistics, time
import torch, torch.distributed as dist
os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", "29533")
dist.init_process_group("nccl", rank=0, world_size=1)
from megatron.core.tensor_parallel.cross_entropy import _VocabParallelCrossEntropy
from megalab.runtime import cross_entropy as C
G = dist.group.WORLD

def timeit(fn, n=20):
    for _ in range(3): fn()
    torch.cuda.synchronize(); ts = []
    for _ in range(n):
        s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    return statistics.median(ts)

torch.manual_seed(0)
s_, b_, V = 1024, 15, 50304
base = (torch.randn(s_, b_, V, device="cuda") * 2).bfloat16()
tgt = torch.randint(0, 50257, (s_, b_), device="cuda")
g = torch.rand(s_, b_, device="cuda")
res = {}
for name, f in (("megatron", lambda x: _VocabParallelCrossEntropy.apply(x, tgt, 0.0, G)),
                ("bf16_ce", lambda x: C.cross_entropy(x, tgt, G))):
    def step():
        x = base.detach().requires_grad_()
        loss = f(x); loss.backward(g); return loss, x.grad
    def fwd():
        x = base.detach().requires_grad_()
        with torch.no_grad(): return f(x)
    loss, grad = step()
    torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats(); m0 = torch.cuda.memory_allocated()
    x = base.detach().requires_grad_(); l = f(x); torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - m0; peak_f = torch.cuda.max_memory_allocated() - m0
    l.backward(g); torch.cuda.synchronize(); peak = torch.cuda.max_memory_allocated() - m0
    del x, l
    res[name] = (loss.float(), grad.float())
    print(f"{name:9s} fwd+bwd {timeit(step):7.2f} ms  fwd {timeit(fwd):6.2f} ms  held after fwd {held/2**30:.2f} GiB  "
          f"peak fwd {peak_f/2**30:.2f} GiB  peak fwd+bwd {peak/2**30:.2f} GiB", flush=True)
(l0, g0), (l1, g1) = res["megatron"], res["bf16_ce"]
print(f"loss max abs diff {(l0-l1).abs().max().item():.3e} (loss ~{l0.mean().item():.3f}); grad max abs diff "
      f"{(g0-g1).abs().max().item():.3e}, grads differing {(g0 != g1).float().mean().item():.2e} of elements")

# QKV-style linear: [tokens, h] @ [h, n]^T + bias, as Megatron does it (matmul, then add) vs one addmm
for tokens, h, n in ((15360, 1600, 4800), (15360, 1600, 2400), (8192, 2048, 6144), (16384, 1280, 3840)):
    x = torch.randn(tokens, h, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, h, device="cuda", dtype=torch.bfloat16); bb = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    x3 = x.view(tokens // 8, 8, h)
    a = timeit(lambda: torch.matmul(x3, w.t()) + bb, 50)
    m = timeit(lambda: torch.matmul(x3, w.t()), 50)
    c = timeit(lambda: torch.addmm(bb, x, w.t()), 50)
    d = (torch.matmul(x3, w.t()) + bb).view(tokens, n).float() - torch.addmm(bb, x, w.t()).float()
    print(f"linear {tokens}x{h}->{n}: matmul+add {a:.3f} ms (matmul alone {m:.3f}), addmm {c:.3f} ms, max|diff| {d.abs().max().item():.2e}", flush=True)
dist.destroy_process_group()
