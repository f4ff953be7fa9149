"""Microbenchmark: what bounds dropout_add's kernels (megalab/runtime/dropout_add.py), the mask's draws or the
bytes. Its forward and backward kernels, launched directly (no autograd, no bias reduction), each four ways:

  philox-10, 4 rows a draw   the kernels as shipped: one Philox4x32-10 call serves four rows (32 bits each)
  no draw                    the same kernels with a mask computed from the index (no Philox): the bytes alone
  philox-7, 4 rows a draw    Philox with 7 rounds (Random123's crush-resistant minimum) instead of 10
  philox-10, 8 rows a draw   one call serves eight rows, 16 bits each: keep where the 16-bit value is at least
                             round(p * 65536), so the drop rate is that over 65536 (0.100006 for p = 0.1)

GPU time per call: the kernels' own time, summed by torch.profiler (megalab/harness/bench.py kernel_us). The
ideal is the bytes each must move (forward: read x and residual, write out; backward: read the gradient, write
dx) at an H100 SXM's datasheet 3.35 TB/s.

Run: python benchmarks/mb-dropout-rng.py > results/bench/dropout-rng-microbench.txt
"""
import torch
import triton
import triton.language as tl

from megalab.harness.bench import kernel_us as gpu_us

SHAPES = [  # (what, [s, b, h])
    ("GPT-2 XL, row 111 (15 x 1024 tokens, hidden 1600)", (1024, 15, 1600)),
    ("GPT-2 24 x 2048 (not a catalog row; 15 x 1024 tokens, hidden 2048)", (1024, 15, 2048)),
    ("GPT-2 XL at micro-batch 14 (not a catalog row)", (1024, 14, 1600)),
]
WAYS = (("philox-10, 4 rows a draw", 0, 10), ("no draw", 1, 10), ("philox-7, 4 rows a draw", 0, 7),
        ("philox-10, 8 rows a draw", 2, 10))
GROUPS, BLOCK_C, WARPS, TILES_PER_PROGRAM = 8, 128, 4, 2


@triton.jit
def _fwd(x_ptr, b_ptr, r_ptr, out_ptr, seed_ptr, rows, n, p, p16, scale,
         MODE: tl.constexpr, ROUNDS: tl.constexpr, G: tl.constexpr, BLOCK: tl.constexpr):
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    cmask = cols < n
    seed = tl.load(seed_ptr)
    bias = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    if MODE == 2:  # 8 rows a draw: rows 8g .. 8g + 7, 16 bits each
        groups = tl.program_id(0) * G + tl.arange(0, G)
        d0, d1, d2, d3 = tl.randint4x(seed, groups[:, None] * n + cols[None, :], ROUNDS)
        for k in tl.static_range(8):
            if k // 2 == 0:
                w = d0
            elif k // 2 == 1:
                w = d1
            elif k // 2 == 2:
                w = d2
            else:
                w = d3
            u = ((w >> (16 * (k % 2))) & 0xFFFF).to(tl.int32)
            r = groups * 8 + k
            m = (r[:, None] < rows) & cmask[None, :]
            offs = r[:, None].to(tl.int64) * n + cols[None, :]
            x = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float32) + bias[None, :]
            y = tl.load(r_ptr + offs, mask=m, other=0.0).to(tl.float32) + tl.where(u >= p16, x * scale, 0.0)
            tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=m)
    else:
        groups = tl.program_id(0) * G + tl.arange(0, G)
        d0, d1, d2, d3 = tl.randint4x(seed, groups[:, None] * n + cols[None, :], ROUNDS)
        for k in tl.static_range(4):
            if MODE == 1:
                keep = ((groups[:, None] * 4 + k) * 7 + cols[None, :] * 13) % 10 != 0
            elif k == 0:
                keep = tl.uint_to_uniform_float(d0) >= p
            elif k == 1:
                keep = tl.uint_to_uniform_float(d1) >= p
            elif k == 2:
                keep = tl.uint_to_uniform_float(d2) >= p
            else:
                keep = tl.uint_to_uniform_float(d3) >= p
            r = groups * 4 + k
            m = (r[:, None] < rows) & cmask[None, :]
            offs = r[:, None].to(tl.int64) * n + cols[None, :]
            x = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float32) + bias[None, :]
            y = tl.load(r_ptr + offs, mask=m, other=0.0).to(tl.float32) + tl.where(keep, x * scale, 0.0)
            tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def _bwd(g_ptr, dx_ptr, seed_ptr, part_ptr, rows, n, p, p16, scale, groups_per_program,
         MODE: tl.constexpr, ROUNDS: tl.constexpr, G: tl.constexpr, BLOCK: tl.constexpr):
    pid_r = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    cmask = cols < n
    seed = tl.load(seed_ptr)
    acc = tl.zeros((G, BLOCK), dtype=tl.float32)
    RPD: tl.constexpr = 8 if MODE == 2 else 4
    first = pid_r * groups_per_program
    last = tl.minimum(first + groups_per_program, tl.cdiv(rows, RPD))
    for g0 in range(first, last, G):
        groups = g0 + tl.arange(0, G)
        d0, d1, d2, d3 = tl.randint4x(seed, groups[:, None] * n + cols[None, :], ROUNDS)
        for k in tl.static_range(RPD):
            if MODE == 2:
                if k // 2 == 0:
                    w = d0
                elif k // 2 == 1:
                    w = d1
                elif k // 2 == 2:
                    w = d2
                else:
                    w = d3
                keep = ((w >> (16 * (k % 2))) & 0xFFFF).to(tl.int32) >= p16
            elif MODE == 1:
                keep = ((groups[:, None] * 4 + k) * 7 + cols[None, :] * 13) % 10 != 0
            elif k == 0:
                keep = tl.uint_to_uniform_float(d0) >= p
            elif k == 1:
                keep = tl.uint_to_uniform_float(d1) >= p
            elif k == 2:
                keep = tl.uint_to_uniform_float(d2) >= p
            else:
                keep = tl.uint_to_uniform_float(d3) >= p
            r = groups * RPD + k
            m = (groups[:, None] < last) & (r[:, None] < rows) & cmask[None, :]
            offs = r[:, None].to(tl.int64) * n + cols[None, :]
            g = tl.load(g_ptr + offs, mask=m, other=0.0).to(tl.float32)
            dx = tl.where(keep & m, g * scale, 0.0)
            tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=m)
            acc += dx
    tl.store(part_ptr + pid_r * n + cols, tl.sum(acc, axis=0), mask=cmask)


def main():
    props = torch.cuda.get_device_properties(0)
    print(torch.cuda.get_device_name(), getattr(props, "uuid", ""), f"{props.multi_processor_count} SMs")
    p = 0.1
    p16 = round(p * 65536)
    for what, shape in SHAPES:
        n = shape[-1]
        rows = shape[0] * shape[1]
        x, r, g = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        b = (torch.randn(n, device="cuda") * 0.1).to(torch.bfloat16)
        out, dx = torch.empty_like(x), torch.empty_like(x)
        seed = torch.randint(0, 2 ** 62, (1,), device="cuda", dtype=torch.int64)
        el = x.numel() * x.element_size()
        print(f"{what}: forward moves {3 * el / 1e6:.0f} MB ({3 * el / 3.35e6:.0f} us at 3.35 TB/s), backward "
              f"{2 * el / 1e6:.0f} MB ({2 * el / 3.35e6:.0f} us)")
        for name, mode, rounds in WAYS:
            rpd = 8 if mode == 2 else 4
            scale = 65536 / (65536 - p16) if mode == 2 else 1 / (1 - p)
            fgrid = (triton.cdiv(triton.cdiv(rows, rpd), GROUPS), triton.cdiv(n, BLOCK_C))
            per = GROUPS * TILES_PER_PROGRAM
            programs = triton.cdiv(triton.cdiv(rows, rpd), per)
            parts = torch.empty(programs, n, device="cuda", dtype=torch.float32)

            def fwd():
                _fwd[fgrid](x, b, r, out, seed, rows, n, p, p16, scale, MODE=mode, ROUNDS=rounds, G=GROUPS,
                            BLOCK=BLOCK_C, num_warps=WARPS)

            def bwd():
                _bwd[(programs, triton.cdiv(n, BLOCK_C))](g, dx, seed, parts, rows, n, p, p16, scale, per,
                                                         MODE=mode, ROUNDS=rounds, G=GROUPS, BLOCK=BLOCK_C,
                                                         num_warps=WARPS)

            f, bw = gpu_us(fwd), gpu_us(bwd)
            fwd()
            bwd()
            kept_f = ((out.float() - r.float()) != 0).float().mean().item()
            kept_b = (dx != 0).float().mean().item()
            print(f"  {name:28s} forward {f[0]:6.1f} us, backward {bw[0]:6.1f} us (kernel alone, bias partials "
                  f"written); kept {kept_f:.4f} / {kept_b:.4f}")
    print(f"torch {torch.__version__}, triton {triton.__version__}")


if __name__ == "__main__":
    main()
