"""Microbenchmark: the QKV projection's output gradient, two ways. Megatron splits the projection's output into
query, key and value views (torch.split along the last dimension when TE is absent); the backward of that split
is a cat of the three gradients SDPA's cuDNN kernel returns, and the linear layer's backward then sums the packed
gradient over every token for the bias (a second pass, in bf16). Here:

  cat + sum       torch.cat of dq, dk, dv (as cuDNN laid them out) then grad.sum(0) in bf16: what runs now
  pack            one Triton kernel writes the packed gradient and each program's column sums of it (fp32), then
                  one small kernel adds the partial sums up (megalab/runtime/param_grad.py's reduction)
  pack, no sums   the same kernel without the sums (the pass that replaces the cat alone)

The gradients come from a real cuDNN attention backward over views of one [s, b, heads, 3 x head] tensor, so their
strides are what the layer's backward sees. GPU time per call: torch.profiler's kernel time
(megalab/harness/bench.py kernel_us). The ideal is the bytes the cat must move (read three, write one) at an H100
SXM's datasheet 3.35 TB/s.

Run: python results/bench/mb-qkv-split.py > results/bench/qkv-split-microbench.txt
"""
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from megalab.harness.bench import kernel_us as gpu_us
from megalab.runtime import param_grad

SHAPES = [  # (what, s, b, heads, head dim)
    ("GPT-2 XL, row 111 (15 x 1024 tokens, 25 heads of 64)", 1024, 15, 25, 64),
    ("GPT-2 24 x 2048 (not a catalog row; 15 x 1024 tokens, 16 heads of 128)", 1024, 15, 16, 128),
    ("GPT-2 XL at micro-batch 14 (not a catalog row)", 1024, 14, 25, 64),
]
TILES = ((32, 4), (64, 4), (16, 4), (32, 8))  # (tokens a step, warps)
PROGRAMS_PER_SM = 4


@triton.jit
def _pack(src, out_ptr, part_ptr, tokens, batch, heads, tokens_per_program, s_s, s_b, s_h, width, W, off,
          SUMS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr):
    """One piece (query, key or value) of the packed gradient: this program's tokens of one head, copied into
    columns [off, off + width) of that head's W, and their sums per column (the bias's partial gradient)."""
    pid_t = tl.program_id(0)
    head = tl.program_id(1)
    cols = tl.arange(0, BLOCK_W)
    cmask = cols < width
    first = pid_t * tokens_per_program
    last = tl.minimum(first + tokens_per_program, tokens)
    acc = tl.zeros((BLOCK_T, BLOCK_W), dtype=tl.float32)
    for t0 in range(first, last, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        m = (t < last)[:, None] & cmask[None, :]
        s = (t // batch).to(tl.int64)
        b = (t % batch).to(tl.int64)
        x = tl.load(src + (s * s_s + b * s_b + head * s_h)[:, None] + cols[None, :], mask=m, other=0.0)
        tl.store(out_ptr + (t.to(tl.int64) * heads * W + head * W + off)[:, None] + cols[None, :], x, mask=m)
        if SUMS:
            acc += x.to(tl.float32)
    if SUMS:
        tl.store(part_ptr + pid_t * heads * W + head * W + off + cols, tl.sum(acc, axis=0), mask=cmask)


def pack_into(pieces, packed, parts, tokens, batch, heads, row_programs, per, sums, block_t, warps):
    W = packed.shape[-1]
    off = 0
    for g in pieces:
        w = g.shape[-1]
        _pack[(row_programs, heads)](g, packed, parts, tokens, batch, heads, per, g.stride(0), g.stride(1),
                                     g.stride(2), w, W, off, SUMS=sums, BLOCK_T=block_t,
                                     BLOCK_W=triton.next_power_of_2(w), num_warps=warps)
        off += w


def main():
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    print(torch.cuda.get_device_name(), getattr(props, "uuid", ""), f"{sms} SMs")
    for what, s, b, heads, hn in SHAPES:
        mixed = torch.randn(s, b, heads, 3 * hn, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        q, k, v = torch.split(mixed, [hn, hn, hn], dim=3)
        qp, kp, vp = (t.permute(1, 2, 0, 3) for t in (q, k, v))
        out = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
        tokens = s * b
        el = 3 * dq.numel() * dq.element_size()
        print(f"{what}: the cat moves {2 * el / 1e6:.0f} MB ({2 * el / 3.35e6:.0f} us at 3.35 TB/s); dq strides "
              f"{tuple(dq.stride())}")
        ref = torch.cat((dq, dk, dv), dim=3)
        ref_sum = ref.view(tokens, -1).float().sum(0)

        def cat_sum():
            torch.cat((dq, dk, dv), dim=3).view(tokens, -1).sum(0)

        cs = gpu_us(cat_sum)
        print(f"  {'cat + sum (bf16)':30s} {cs[0]:6.1f} us ({cs[1]:.0f} kernels); cat alone "
              f"{gpu_us(lambda: torch.cat((dq, dk, dv), dim=3))[0]:6.1f} us")
        for block_t, warps in TILES:
            row_programs = max(1, min(triton.cdiv(tokens, block_t), -(-sms * PROGRAMS_PER_SM // heads)))
            per = triton.cdiv(tokens, row_programs)
            row_programs = triton.cdiv(tokens, per)
            packed = torch.empty(s, b, heads, 3 * hn, device="cuda", dtype=torch.bfloat16)
            parts = param_grad.tables(1, row_programs, heads * 3 * hn, "cuda")
            bias = torch.empty(heads * 3 * hn, device="cuda", dtype=torch.bfloat16)

            def pack(sums=True):
                pack_into((dq, dk, dv), packed, parts, tokens, b, heads, row_programs, per, sums, block_t, warps)
                if sums:
                    return param_grad.reduce([bias], parts)[0]

            got = pack()
            exact = torch.equal(packed, ref)
            err = (got.float() - ref_sum).abs().max().item()
            p, pn = gpu_us(pack), gpu_us(lambda: pack(False))
            print(f"  pack ({block_t} tokens a step, {warps} warps, {row_programs} x {heads} programs) {p[0]:6.1f} us "
                  f"({p[1]:.0f} kernels); no sums {pn[0]:6.1f} us; packed equal to cat: {exact}; bias sum differs "
                  f"from fp32 by {err:.3g}")
    print(f"torch {torch.__version__}, triton {triton.__version__}")


if __name__ == "__main__":
    main()
