"""Microbenchmark: the QKV projection's output gradient, two ways. Megatron splits the projection's output into
query, key and value views (torch.split along the last dimension when TE is absent); the backward of that split
is a cat of the three gradients SDPA's cuDNN kernel returns, and the linear layer's backward then sums the packed
gradient over every token for the bias (a second pass, in bf16). Here:

  cat + sum       torch.cat of dq, dk, dv (as cuDNN laid them out) then grad.sum(0) in bf16: what runs now
  pack            the qkv_pack lever's backward (megalab/runtime/qkv_split.py): its Triton kernel, once for each
                  piece, writes the packed gradient and each program's column sums of it (fp32), then one small
                  kernel adds the partial sums up (megalab/runtime/param_grad.py's reduction); at several tiles
  pack, no sums   the same kernel without the sums (the pass that replaces the cat alone)

The gradients come from a real cuDNN attention backward over views of one [s, b, heads, 3 x head] tensor, so their
strides are what the layer's backward sees. GPU time per call: torch.profiler's kernel time
(megalab/harness/bench.py kernel_us). The ideal is the bytes the cat must move (read three, write one) at an H100
SXM's datasheet 3.35 TB/s.

Run: python benchmarks/mb-qkv-split.py > results/bench/qkv-split-microbench.txt
"""
import torch
import torch.nn.functional as F
import triton

from megalab.harness.bench import kernel_us as gpu_us
from megalab.runtime import param_grad, qkv_split
from megalab.runtime.jit import kernel

SHAPES = [  # (what, s, b, heads, head dim)
    ("GPT-2 XL, row 111 (15 x 1024 tokens, 25 heads of 64)", 1024, 15, 25, 64),
    ("GPT-2 24 x 2048 (not a catalog row; 15 x 1024 tokens, 16 heads of 128)", 1024, 15, 16, 128),
    ("GPT-2 XL at micro-batch 14 (not a catalog row)", 1024, 14, 25, 64),
]
TILES = ((qkv_split.BLOCK_TOKENS, qkv_split.WARPS), (32, 4), (16, 4), (32, 8))  # (tokens a step, warps): shipped first
PROGRAMS_PER_SM = qkv_split.PROGRAMS_PER_SM


def pack_into(pieces, packed, parts, tokens, batch, heads, row_programs, per, sums, block_t, warps):
    """The lever's backward, its tile given: qkv_split's kernel once a piece."""
    W = packed.shape[-1]
    off = 0
    for g in pieces:
        w = g.shape[-1]
        kernel(qkv_split.pack)[(row_programs, heads)](g, packed, parts, tokens, batch, heads, per, g.stride(0),
                                                        g.stride(1), g.stride(2), w, W, off, SUMS=sums,
                                                        BLOCK_T=block_t, BLOCK_W=triton.next_power_of_2(w),
                                                        num_warps=warps)
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
                  f"({p[1]:.0f} kernels); no sums {pn[0]:6.1f} us; packed equal to cat: {exact}; bias sum (bf16) differs "
                  f"from the fp32 sum by {err:.3g}")
    print(f"torch {torch.__version__}, triton {triton.__version__}")


if __name__ == "__main__":
    main()
