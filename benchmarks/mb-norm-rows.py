"""Microbenchmark: triton_norm's LayerNorm backward (megalab/runtime/triton_norm.py, with norm_residual's
residual gradient added in) one row at a time, as shipped, against the same math over a tile of several rows
per step of a program's loop, so that a program has several rows' loads in flight instead of one. Each way:
the backward kernel and param_grad's reduction of its partial sums into fp32 main_grads, launched directly.

GPU time per call: the kernels' own time, summed by torch.profiler (megalab/harness/bench.py kernel_us). The
ideal is the bytes the backward must move (read x, dy and the residual's gradient, write dx) at an H100 SXM's
datasheet 3.35 TB/s.

Run: python benchmarks/mb-norm-rows.py > results/bench/norm-rows-microbench.txt
"""
import torch
import triton
import triton.language as tl

from megalab.harness.bench import kernel_us as gpu_us
from megalab.runtime import param_grad, triton_norm

SHAPES = [  # (what, tokens, hidden)
    ("GPT-2 XL, row 111 (15 x 1024 tokens, hidden 1600)", 15360, 1600),
    ("GPT-2 24 x 2048 (not a catalog row; 15 x 1024 tokens)", 15360, 2048),
    ("GPT-2 XL at micro-batch 14 (not a catalog row)", 14336, 1600),
]
WAYS = ((1, 4, 4), (2, 4, 4), (2, 8, 4), (4, 8, 4), (4, 8, 2), (8, 8, 2), (4, 16, 2))  # (rows a step, warps, programs an SM)


@triton.jit
def _bwd_rows(x_ptr, w_ptr, dy_ptr, dr_ptr, dx_ptr, mean_ptr, rstd_ptr, dw_ptr, db_ptr, rows, n, rows_per_program,
              ROWS: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    gamma = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros((ROWS, BLOCK), dtype=tl.float32)
    db = tl.zeros((ROWS, BLOCK), dtype=tl.float32)
    first = pid * rows_per_program
    last = tl.minimum(first + rows_per_program, rows)
    for r0 in range(first, last, ROWS):
        r = r0 + tl.arange(0, ROWS)
        rm = r < last
        m = rm[:, None] & mask[None, :]
        off = r.to(tl.int64)[:, None] * n + cols[None, :]
        x = tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + off, mask=m, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + r, mask=rm, other=0.0)
        mean = tl.load(mean_ptr + r, mask=rm, other=0.0)
        xhat = tl.where(m, (x - mean[:, None]) * rstd[:, None], 0.0)
        wdy = gamma[None, :] * dy
        c1 = tl.sum(xhat * wdy, axis=1) / n
        c2 = tl.sum(wdy, axis=1) / n
        dx = (wdy - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
        dx += tl.load(dr_ptr + off, mask=m, other=0.0).to(tl.float32)
        tl.store(dx_ptr + off, dx.to(dx_ptr.dtype.element_ty), mask=m)
        dw += dy * xhat
        db += dy
    tl.store(dw_ptr + pid * n + cols, tl.sum(dw, axis=0), mask=mask)
    tl.store(db_ptr + pid * n + cols, tl.sum(db, axis=0), mask=mask)


def main():
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    print(torch.cuda.get_device_name(), getattr(props, "uuid", ""), f"{sms} SMs")
    for what, rows, n in SHAPES:
        x, dy, dr = (torch.randn(rows, n, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        w = torch.nn.Parameter(torch.randn(n, device="cuda", dtype=torch.bfloat16))
        b = torch.nn.Parameter(torch.randn(n, device="cuda", dtype=torch.bfloat16))
        for p in (w, b):
            p.main_grad = torch.zeros(n, device="cuda", dtype=torch.float32)
            p.grad_added_to_main_grad = False
        xf = x.float()
        mean = xf.mean(1)
        rstd = 1 / (xf.var(1, unbiased=False) + 1e-5).sqrt()
        dx = torch.empty_like(x)
        block = triton.next_power_of_2(n)
        el = rows * n * 2
        print(f"{what}: the backward moves {4 * el / 1e6:.0f} MB ({4 * el / 3.35e6:.0f} us at 3.35 TB/s)")
        ref = None
        for rows_a_step, warps, per_sm in WAYS:
            programs = max(1, min(-(-rows // 8), sms * per_sm))
            per = triton.cdiv(rows, programs)
            programs = triton.cdiv(rows, per)
            parts = param_grad.tables(2, programs, n, "cuda")

            def bwd():
                if rows_a_step == 1:  # the shipped kernel (its loop unpipelined when this file's output was taken)
                    triton_norm.kernel(triton_norm.norm_backward)[(programs,)](
                        x, w, dy, dr, dx, mean, rstd, parts[0], parts[1], rows, n, per, RMS=False, HAS_BIAS=True,
                        SHIFTED=False, HAS_RES=True, BLOCK=block, STAGES=triton_norm.STAGES, num_warps=warps)
                else:
                    _bwd_rows[(programs,)](x, w, dy, dr, dx, mean, rstd, parts[0], parts[1], rows, n, per,
                                           ROWS=rows_a_step, BLOCK=block, num_warps=warps)
                param_grad.reduce([w, b], parts)

            t = gpu_us(bwd)
            bwd()
            if ref is None:
                ref = dx.clone()
            diff = (dx.float() - ref.float()).abs().max().item()
            label = ("shipped, 1 row a step" if rows_a_step == 1 else f"{rows_a_step} rows a step") + \
                f", {warps} warps, {per_sm}/SM"
            print(f"  {label:36s} {t[0]:6.1f} us ({t[1]:.0f} kernels); dx differs from shipped by {diff:.3g}")
    print(f"torch {torch.__version__}, triton {triton.__version__}")


if __name__ == "__main__":
    main()
