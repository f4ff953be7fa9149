"""Which flat AdamW kernel variant keeps the bandwidth (1.56e9 parameters, GPT-2 XL shapes, Megatron-like group
order): block size, warps, the clip coefficient on or off, IEEE (sqrt_rn, div_rn) or approximate ops. Run on
one GPU: python benchmarks/mb-flat-adam-variants.py. Its one run (1x H100, 2026-11-26, megalab 41b888f's
kernel as `flat_adam.step`) was read on the device and not kept: the first kernel took 15.9 ms without the clip
coefficient and 23.3 ms with it; IEEE ops at 1024-2048 elements on 8 warps held 15.7-15.8 ms either way, while
approximate ops or 4096-8192 elements on 4 warps fell to 22-39 ms. megalab/runtime/flat_adam.py took 2048 x 8
warps, IEEE; results/bench/flat-adam-microbench.txt is the kept run of that kernel."""
import time, sys
import torch, triton
import triton.language as tl
sys.path.insert(0, ".")
from megalab.runtime import flat_adam

@triton.jit
def v_mul(p_ptr, g_ptr, m_ptr, v_ptr, out_ptr, starts_ptr, counts_ptr, groups_ptr, scale_ptr,
          lr0, wd0, lr1, wd1, lr2, wd2, lr3, wd3, beta1, beta2, eps, bc1, bc2_sqrt,
          HAS_SCALE: tl.constexpr, BLOCK: tl.constexpr, FAST: tl.constexpr):
    pid = tl.program_id(0)
    start = tl.load(starts_ptr + pid)
    count = tl.load(counts_ptr + pid)
    grp = tl.load(groups_ptr + pid)
    lr = tl.where(grp == 0, lr0, tl.where(grp == 1, lr1, tl.where(grp == 2, lr2, lr3)))
    wd = tl.where(grp == 0, wd0, tl.where(grp == 1, wd1, tl.where(grp == 2, wd2, wd3)))
    idx = tl.arange(0, BLOCK)
    mask = idx < count
    offs = start + idx
    p = tl.load(p_ptr + offs, mask=mask, other=0.0)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0)
    m = tl.load(m_ptr + offs, mask=mask, other=0.0)
    v = tl.load(v_ptr + offs, mask=mask, other=0.0)
    if HAS_SCALE:
        g = g * (1.0 / tl.load(scale_ptr))
    p = p - lr * wd * p
    m = beta1 * m + (1.0 - beta1) * g
    v = beta2 * v + (1.0 - beta2) * g * g
    if FAST:
        denom = tl.sqrt(v) * (1.0 / bc2_sqrt) + eps
        p = p - tl.fdiv((lr / bc1) * m, denom)
    else:
        denom = tl.sqrt_rn(v) / bc2_sqrt + eps
        p = p - tl.div_rn((lr / bc1) * m, denom)
    tl.store(p_ptr + offs, p, mask=mask)
    tl.store(m_ptr + offs, m, mask=mask)
    tl.store(v_ptr + offs, v, mask=mask)
    tl.store(out_ptr + offs, p.to(out_ptr.dtype.element_ty), mask=mask)

L, H, V, S = 48, 1600, 50304, 1024
SHAPES = [(V, H), (S, H)]
for _ in range(L):
    SHAPES += [(H,), (H,), (3 * H, H), (3 * H,), (H, H), (H,), (H,), (H,), (4 * H, H), (4 * H,), (H, 4 * H), (H,)]
SHAPES += [(H,), (H,)]

def timed(fn, reps=15):
    for _ in range(3): fn()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(reps): fn()
    torch.cuda.synchronize(); return (time.perf_counter() - t) / reps * 1e3

weights = [torch.nn.Parameter(torch.randn(s, device="cuda").to(torch.bfloat16) * 0.02) for s in SHAPES]
total = sum(w.numel() for w in weights)
buf = torch.randn(total, device="cuda") * 1e-3
off = 0
for w in reversed(weights):
    w.main_grad = buf[off:off + w.numel()].view(w.shape); off += w.numel()
masters = [w.detach().clone().float() for w in weights]
decay = [i for i, m in enumerate(masters) if m.dim() > 1]; rest = [i for i, m in enumerate(masters) if m.dim() == 1]
from megalab.runtime import fastpath
opt = fastpath.FusedAdamW([{"params": [masters[i] for i in decay], "weight_decay": 0.1},
                           {"params": [masters[i] for i in rest], "weight_decay": 0.0}], lr=1e-4, betas=(0.9, 0.95), eps=1e-8)
for m, w in zip(masters, weights): m.grad = w.main_grad
pairs = [(masters[i], weights[i]) for i in decay + rest]  # Megatron's order: group by group
assert flat_adam.adopt(opt, pairs)
sp = opt.flat_adam[0]
scale = torch.tensor(3.0, device="cuda")
n = total
print(torch.cuda.get_device_name(), "params", n)
print("flat_adam.step no scale  %.2f ms" % timed(opt.step))
def with_scale():
    opt.grad_scale = scale; opt.step()
print("flat_adam.step scale     %.2f ms" % timed(with_scale))
hyper = [1e-4, 0.1, 1e-4, 0.0, 1e-4, 0.0, 1e-4, 0.0]
def launch(k, block, warps, has_scale, fast, starts, counts, groups):
    def f():
        k[(starts.numel(),)](sp.master, sp.grad, sp.exp_avg, sp.exp_avg_sq, sp.weight, starts, counts, groups, scale,
                             *hyper, 0.9, 0.95, 1e-8, 0.5, 0.7, HAS_SCALE=has_scale, BLOCK=block, FAST=fast, num_warps=warps)
    return f
entries = []
for main, model in pairs:
    entries.append((model.main_grad.storage_offset(), model.numel(), 0 if main.dim() > 1 else 1))
for block in (1024, 2048, 4096, 8192):
    flat_adam.BLOCK = block
    t = flat_adam.table(entries, "cuda")
    tsorted = flat_adam.table(sorted(entries), "cuda")
    for warps in (4, 8, 16):
        if block // (32 * warps) < 1: continue
        for hs in (False, True):
            for fast in (False, True):
                ms = timed(launch(v_mul, block, warps, hs, fast, *t))
                ms2 = timed(launch(v_mul, block, warps, hs, fast, *tsorted))
                print(f"block {block:5d} warps {warps:2d} scale {hs:d} fast {fast:d}: {ms:6.2f} ms  sorted-by-offset {ms2:6.2f} ms  ({30*n/ms/1e6:.0f} GB/s)")
