"""Microbenchmark: grid shapes and streaming hints for the three backward kernels still furthest from their bytes'
floor at row 111 after the pipelined loops (results/bench/pipelined-loops-microbench.txt): bias_gelu's (221 against
176 us), the norm's (81 against 59) and qkv_pack's (125 against 88). Ways tried, each a copy of the kernel with
the change; "shipped" is the kernel megalab/runtime has now, with its constants. Two were taken: the norm's
backward at 3 programs an SM (was 4), and qkv_pack's three pieces in one launch (program_id(2) picks the piece;
through 0c57b23 one launch each, the copy "three launches" here). Nothing won for bias_gelu.

  tile R x C, W warps   bias_gelu: rows x columns a program handles a step of its loop, warps a program
  N/SM                  programs an SM the grid is sized by (the partial-sum table has a row for each)
  stages S              the loop as Triton's `tl.range(..., num_stages=S)`: S - 1 later steps' loads in flight
  evict first           loads marked `eviction_policy="evict_first"`: streamed data not kept in L2

GPU time per call: torch.profiler's kernel time (megalab/harness/bench.py kernel_us), with param_grad's reduction
of the partial sums; "differs" is the largest difference from the shipped kernel's output. Shapes as in
mb-pipelined-loops.py: row 111 and two that are not catalog rows.

Run: python benchmarks/mb-grid-tuning.py > results/bench/grid-tuning-microbench.txt
"""
import importlib.util
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[1]  # the repository
spec = importlib.util.spec_from_file_location("mbp", ROOT / "benchmarks/mb-pipelined-loops.py")  # its helpers
mbp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mbp)
from megalab.harness.bench import kernel_us as gpu_us  # noqa: E402
from megalab.runtime import bias_gelu, param_grad, qkv_split, triton_norm  # noqa: E402
from megalab.runtime.jit import kernel  # noqa: E402


@triton.jit
def _gelu_bwd(g_ptr, y_ptr, b_ptr, dx_ptr, part_ptr, rows, n, rows_per_program, BLOCK_R: tl.constexpr,
              BLOCK_C: tl.constexpr, STAGES: tl.constexpr, EVICT: tl.constexpr):
    pid_r = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < n
    bias = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    acc = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    first = pid_r * rows_per_program
    last = tl.minimum(first + rows_per_program, rows)
    for r0 in tl.range(first, last, BLOCK_R, num_stages=STAGES):
        r = r0 + tl.arange(0, BLOCK_R)
        m = (r[:, None] < last) & cmask[None, :]
        offs = r[:, None].to(tl.int64) * n + cols[None, :]
        if EVICT:
            g = tl.load(g_ptr + offs, mask=m, other=0.0, eviction_policy="evict_first").to(tl.float32)
            x = tl.load(y_ptr + offs, mask=m, other=0.0, eviction_policy="evict_first").to(tl.float32)
        else:
            g = tl.load(g_ptr + offs, mask=m, other=0.0).to(tl.float32)
            x = tl.load(y_ptr + offs, mask=m, other=0.0).to(tl.float32)
        x = x + bias[None, :]
        t = 2.0 * tl.sigmoid(2.0 * (0.79788456 * x * (1.0 + 0.044715 * x * x))) - 1.0
        ff = 0.5 * x * ((1.0 - t * t) * (0.79788456 + 0.1070322243 * x * x)) + 0.5 * (1.0 + t)
        dx = tl.where(m, ff * g, 0.0)
        tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=m)
        acc += dx
    tl.store(part_ptr + pid_r * n + cols, tl.sum(acc, axis=0), mask=cmask)


@triton.jit
def _norm_bwd(x_ptr, w_ptr, dy_ptr, dr_ptr, dx_ptr, mean_ptr, rstd_ptr, dw_ptr, db_ptr, rows, n, rows_per_program,
              BLOCK: tl.constexpr, STAGES: tl.constexpr, EVICT: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    gamma = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK,), dtype=tl.float32)
    db = tl.zeros((BLOCK,), dtype=tl.float32)
    first = pid * rows_per_program
    last = tl.minimum(first + rows_per_program, rows)
    for row in tl.range(first, last, num_stages=STAGES):
        off = tl.cast(row, tl.int64) * n
        if EVICT:
            x = tl.load(x_ptr + off + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            dy = tl.load(dy_ptr + off + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            dr = tl.load(dr_ptr + off + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        else:
            x = tl.load(x_ptr + off + cols, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_ptr + off + cols, mask=mask, other=0.0).to(tl.float32)
            dr = tl.load(dr_ptr + off + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row)
        xhat = tl.where(mask, (x - tl.load(mean_ptr + row)) * rstd, 0.0)
        wdy = gamma * dy
        c1 = tl.sum(xhat * wdy, axis=0) / n
        c2 = tl.sum(wdy, axis=0) / n
        dx = (wdy - (xhat * c1 + c2)) * rstd + dr
        tl.store(dx_ptr + off + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += dy * xhat
        db += dy
    tl.store(dw_ptr + pid * n + cols, dw, mask=mask)
    tl.store(db_ptr + pid * n + cols, db, mask=mask)


@triton.jit
def _pack3(q, k, v, out_ptr, part_ptr, tokens, batch, heads, tokens_per_program, qs_s, qs_b, qs_h, ks_s, ks_b, ks_h,
           vs_s, vs_b, vs_h, width, W, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr, EVICT: tl.constexpr,
           STAGES: tl.constexpr):
    """qkv_split.pack for all three pieces in one launch: program_id(2) picks the piece."""
    pid_t = tl.program_id(0)
    head = tl.program_id(1)
    piece = tl.program_id(2)
    if piece == 0:
        src, s_s, s_b, s_h = q, qs_s, qs_b, qs_h
    elif piece == 1:
        src, s_s, s_b, s_h = k, ks_s, ks_b, ks_h
    else:
        src, s_s, s_b, s_h = v, vs_s, vs_b, vs_h
    off = piece * width
    cols = tl.arange(0, BLOCK_W)
    cmask = cols < width
    first = pid_t * tokens_per_program
    last = tl.minimum(first + tokens_per_program, tokens)
    acc = tl.zeros((BLOCK_T, BLOCK_W), dtype=tl.float32)
    for t0 in tl.range(first, last, BLOCK_T, num_stages=STAGES):
        t = t0 + tl.arange(0, BLOCK_T)
        m = (t < last)[:, None] & cmask[None, :]
        s = (t // batch).to(tl.int64)
        b = (t % batch).to(tl.int64)
        ptrs = src + (s * s_s + b * s_b + head * s_h)[:, None] + cols[None, :]
        if EVICT:
            x = tl.load(ptrs, mask=m, other=0.0, eviction_policy="evict_first")
        else:
            x = tl.load(ptrs, mask=m, other=0.0)
        tl.store(out_ptr + (t.to(tl.int64) * heads * W + head * W + off)[:, None] + cols[None, :], x, mask=m)
        acc += x.to(tl.float32)
    tl.store(part_ptr + pid_t * heads * W + head * W + off + cols, tl.sum(acc, axis=0), mask=cmask)


def gelu(rows, n, sms):
    g, y = (torch.randn(rows, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    bias = torch.nn.Parameter(torch.randn(n, device="cuda", dtype=torch.bfloat16))
    bias.main_grad = torch.zeros(n, device="cuda", dtype=torch.float32)
    bias.grad_added_to_main_grad = False
    dx = torch.empty_like(y)
    print(" bias_gelu backward")

    def run(block_r, block_c, warps, per_sm, stages, evict, shipped=False):
        col_blocks = triton.cdiv(n, block_c)
        programs, per = mbp.grid_rows(rows, block_r, per_sm, col_blocks, sms)
        parts = param_grad.tables(1, programs, n, "cuda")

        def f():
            if shipped:
                kernel(bias_gelu.bias_gelu_backward)[(programs, col_blocks)](
                    g, y, bias, dx, parts[0], rows, n, per, BLOCK_R=block_r, BLOCK_C=block_c, num_warps=warps)
            else:
                _gelu_bwd[(programs, col_blocks)](g, y, bias, dx, parts[0], rows, n, per, BLOCK_R=block_r,
                                                  BLOCK_C=block_c, STAGES=stages, EVICT=evict, num_warps=warps)
            param_grad.reduce([bias], parts)
        return f

    ship = (bias_gelu.BLOCK_ROWS, bias_gelu.BLOCK_COLS, bias_gelu.WARPS, bias_gelu.PROGRAMS_PER_SM)
    run(*ship, 1, False, shipped=True)()
    ref = dx.clone()
    mbp.report("shipped", run(*ship, 1, False, shipped=True), dx, ref)
    for way in ((64, 64, 4, 4, 1, True), (64, 128, 8, 4, 1, False), (64, 128, 8, 4, 1, True), (128, 64, 8, 4, 1, True),
                (64, 64, 4, 8, 1, True), (32, 128, 4, 4, 1, True), (64, 128, 8, 2, 2, True), (64, 64, 4, 2, 2, True),
                (64, 64, 4, 4, 3, False), (64, 64, 4, 2, 3, False), (32, 64, 4, 4, 3, False)):
        mbp.report(f"{way[0]} x {way[1]}, {way[2]} warps, {way[3]}/SM, {way[4]} stages"
                   f"{', evict first' if way[5] else ''}", run(*way), dx, ref)


def norm(rows, n, sms):
    x, dy, dr = (torch.randn(rows, n, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    w, b = (torch.nn.Parameter(torch.randn(n, device="cuda", dtype=torch.bfloat16)) for _ in range(2))
    for p in (w, b):
        p.main_grad = torch.zeros(n, device="cuda", dtype=torch.float32)
        p.grad_added_to_main_grad = False
    xf = x.float()
    mean, rstd = xf.mean(1), 1 / (xf.var(1, unbiased=False) + 1e-5).sqrt()
    dx = torch.empty_like(x)
    block = triton.next_power_of_2(n)
    print(" norm backward")

    def run(stages, evict, per_sm, warps, shipped=False):
        programs = max(1, min(-(-rows // triton_norm.MIN_ROWS), sms * per_sm))
        per = triton.cdiv(rows, programs)
        programs = triton.cdiv(rows, per)
        parts = param_grad.tables(2, programs, n, "cuda")

        def f():
            if shipped:
                kernel(triton_norm.norm_backward)[(programs,)](
                    x, w, dy, dr, dx, mean, rstd, parts[0], parts[1], rows, n, per, RMS=False, HAS_BIAS=True,
                    SHIFTED=False, HAS_RES=True, BLOCK=block, STAGES=triton_norm.STAGES, num_warps=warps)
            else:
                _norm_bwd[(programs,)](x, w, dy, dr, dx, mean, rstd, parts[0], parts[1], rows, n, per, BLOCK=block,
                                       STAGES=stages, EVICT=evict, num_warps=warps)
            param_grad.reduce([w, b], parts)
        return f

    warps = triton_norm.warps(block)
    run(3, False, triton_norm.PROGRAMS_PER_SM, warps, shipped=True)()
    ref = dx.clone()
    mbp.report(f"shipped ({triton_norm.PROGRAMS_PER_SM}/SM)", run(3, False, triton_norm.PROGRAMS_PER_SM, warps,
                                                                   shipped=True), dx, ref)
    for way in ((3, False, 4, warps), (3, True, 4, warps), (3, False, 3, warps), (3, True, 3, warps), (3, False, 4, 8),
                (2, True, 6, warps), (3, True, 6, 2)):
        mbp.report(f"{way[0]} stages{', evict first' if way[1] else ''}, {way[2]}/SM, {way[3]} warps", run(*way),
                   dx, ref)


def pack(s, b, heads, hn, sms):
    import torch.nn.functional as F

    mixed = torch.randn(s, b, heads, 3 * hn, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    q, k, v = torch.split(mixed, [hn, hn, hn], dim=3)
    out = F.scaled_dot_product_attention(*(t.permute(1, 2, 0, 3) for t in (q, k, v)), is_causal=True)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    tokens, W = s * b, 3 * hn
    packed = torch.empty(s, b, heads, W, device="cuda", dtype=torch.bfloat16)
    bias = torch.empty(heads * W, device="cuda", dtype=torch.bfloat16)
    print(" qkv_pack backward")

    def run(per_sm, evict, stages=1, shipped=False, three=False):
        programs, per = mbp.grid_rows(tokens, qkv_split.BLOCK_TOKENS, per_sm, heads, sms)
        parts = param_grad.tables(1, programs, heads * W, "cuda")
        strides = [x for g in (dq, dk, dv) for x in g.stride()[:3]]

        def f():
            if shipped:
                kernel(qkv_split.pack)[(programs, heads, 3)](dq, dk, dv, packed, parts, tokens, b, heads, per,
                                                              *strides, hn, hn, W, SUMS=True,
                                                              BLOCK_T=qkv_split.BLOCK_TOKENS,
                                                              BLOCK_W=triton.next_power_of_2(hn),
                                                              num_warps=qkv_split.WARPS)
            elif three:  # one launch a piece, as shipped through 0c57b23 (mb-pipelined-loops.py's copy, 1 stage)
                for i, g in enumerate((dq, dk, dv)):
                    mbp.pack[(programs, heads)](g, packed, parts, tokens, b, heads, per, *g.stride()[:3], hn, W,
                                                 i * hn, BLOCK_T=qkv_split.BLOCK_TOKENS,
                                                 BLOCK_W=triton.next_power_of_2(hn), STAGES=1,
                                                 num_warps=qkv_split.WARPS)
            else:
                _pack3[(programs, heads, 3)](dq, dk, dv, packed, parts, tokens, b, heads, per, *strides, hn, W,
                                             BLOCK_T=qkv_split.BLOCK_TOKENS, BLOCK_W=triton.next_power_of_2(hn),
                                             EVICT=evict, STAGES=stages, num_warps=qkv_split.WARPS)
            param_grad.reduce([bias], parts)
        return f

    run(qkv_split.PROGRAMS_PER_SM, False, shipped=True)()
    ref = packed.clone()
    mbp.report("shipped (one launch)", run(qkv_split.PROGRAMS_PER_SM, False, shipped=True), packed, ref)
    mbp.report("three launches, 4/SM", run(4, False, three=True), packed, ref)
    for per_sm, evict, stages in ((4, False, 1), (4, True, 1), (2, False, 1), (2, True, 1), (8, True, 1),
                                  (4, False, 3), (2, False, 3), (2, True, 3)):
        mbp.report(f"one launch, {per_sm}/SM (x3 pieces), {stages} stages{', evict first' if evict else ''}",
                   run(per_sm, evict, stages), packed, ref)


def main():
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    print(torch.cuda.get_device_name(), getattr(props, "uuid", ""), f"{sms} SMs")
    for what, s, b, heads, hn in mbp.SHAPES:
        rows, n = s * b, heads * hn
        print(what)
        gelu(rows, 4 * n, sms)
        norm(rows, n, sms)
        pack(s, b, heads, hn, sms)
    print(f"torch {torch.__version__}, triton {triton.__version__}")


if __name__ == "__main__":
    sys.exit(main())
