"""Microbenchmark behind flat_adam (megalab/runtime/flat_adam.py), on one GPU: one optimizer step of GPT-2 XL's
1.56e9 parameters (row 101's shapes), fp32 masters of bf16 weights, two parameter groups (decay / none).

  torch + copy : megalab's FusedAdamW (torch fused AdamW) over the separate masters, then Megatron's
                 master-to-weight copy, one copy_ per tensor (_multi_tensor_copy_this_to_that with bf16);
  flat         : flat_adam's kernel over buffers laid out like Megatron's grad buffer (reverse order).

Run: python benchmarks/mb-flat-adam.py > results/bench/flat-adam-microbench.txt
"""
import time

import torch

from megalab.runtime import fastpath, flat_adam

L, H, V, S = 48, 1600, 50304, 1024
SHAPES = [(V, H), (S, H)]
for _ in range(L):
    SHAPES += [(H,), (H,), (3 * H, H), (3 * H,), (H, H), (H,), (H,), (H,), (4 * H, H), (4 * H,), (H, 4 * H), (H,)]
SHAPES += [(H,), (H,)]


def build():
    weights = [torch.nn.Parameter(torch.randn(s, device="cuda").to(torch.bfloat16) * 0.02) for s in SHAPES]
    total = sum(w.numel() for w in weights)
    buffer = torch.randn(total, device="cuda") * 1e-3
    off = 0
    for w in reversed(weights):
        w.main_grad = buffer[off:off + w.numel()].view(w.shape)
        off += w.numel()
    masters = [w.detach().clone().float() for w in weights]
    decay = [m for m in masters if m.dim() > 1]
    rest = [m for m in masters if m.dim() == 1]
    opt = fastpath.FusedAdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                              lr=1e-4, betas=(0.9, 0.95), eps=1e-8)
    for m, w in zip(masters, weights):
        m.grad = w.main_grad
    return opt, masters, weights, total


def timed(fn, reps=20, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps * 1e3


def main():
    print(torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).uuid if hasattr(
        torch.cuda.get_device_properties(0), "uuid") else "")
    opt, masters, weights, n = build()

    scale = torch.tensor(3.0, device="cuda")  # clip_in_adam's coefficient: every catalog run clips early on

    def torch_and_copy(clip):
        opt.grad_scale = scale if clip else None
        opt.step()
        for m, w in zip(masters, weights):
            w.data.copy_(m)

    def flat(clip):
        opt.grad_scale = scale if clip else None
        opt.step()

    base = [timed(lambda: torch_and_copy(c)) for c in (False, True)]
    assert flat_adam.adopt(opt, list(zip(masters, weights))), opt.flat_adam_off
    new = [timed(lambda: flat(c)) for c in (False, True)]
    print(f"parameters {n:,} in {len(SHAPES)} tensors")
    for i, what in enumerate(("no clip", "clip coefficient")):
        print(f"{what:16s} torch fused AdamW + per-tensor copy: {base[i]:7.2f} ms ({34 * n / base[i] / 1e6:.0f} GB/s "
              f"at 34 B/param); flat_adam kernel: {new[i]:7.2f} ms ({30 * n / new[i] / 1e6:.0f} GB/s at 30 B/param)")
    print(f"torch {torch.__version__}")


if __name__ == "__main__":
    main()
