"""Microbenchmark: megalab's four row-walking backward kernels with their loads pipelined. Each walks a block of
rows (or tokens) in a loop and keeps column sums in registers; as written through 7f7d795 a step's loads are issued
only when the step before has stored, so each step waits a whole DRAM round trip with few warps an SM to cover it
(the kernels sat at 55-80% of the bytes' floor: norm 95 against 59 us at row 111). Ways tried, each a copy of
the kernel with the change; a copy at 1 stage (dropout_add's: 2 tiles, no loads first) is the kernel as of
7f7d795. "shipped" is the kernel megalab/runtime has now, with its constants: the norm's and dropout_add's
backward took the winners here (3 stages; 3 stages, 4 loads first, 8 tiles).

  stages S        the loop as Triton's `tl.range(..., num_stages=S)`: S - 1 later steps' loads in flight (S = 1: none)
  early residual  norm only: the residual's gradient loaded with x and dy, before the row's two reductions, instead
                  of after them (a second round trip a row)
  4 loads first   dropout_add only: the four rows that share a draw loaded before any is computed and stored
  tiles T         dropout_add only: tiles a program walks (7f7d795: 2 backward, 1 forward), so that the pipeline
                  has steps to fill
  columns C       param_grad's reduction of a partial-sum table: columns a program sums (7f7d795: 64), so that a
                  table of hidden 1600 has more than 25 programs walking its rows

Kernels: triton_norm's LayerNorm backward with norm_residual's gradient (and param_grad's reduction of its partial
sums, as shipped), bias_gelu's backward (with its reduction), qkv_pack's pack (with the reduction; the copies take
three launches, the shipped kernel one since mb-grid-tuning.py), dropout_add's backward (with the reduction) and
forward, param_grad's reduction alone at each kernel's table. GPU time per call: torch.profiler's kernel time
(megalab/harness/bench.py kernel_us); "differs" is the largest difference from the shipped kernel's output.

The reduction's section compares its copies with each other only: in the committed run the copy at the shipped
tile (64 x 64, 1 stage, one launch a table) took about three times the shipped kernel (both tables in one launch),
a difference this file does not explain; nothing from that section was adopted.

Run: python benchmarks/mb-pipelined-loops.py > results/bench/pipelined-loops-microbench.txt
"""
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from megalab.harness.bench import kernel_us as gpu_us
from megalab.runtime import bias_gelu, dropout_add, param_grad, qkv_split, triton_norm
from megalab.runtime.jit import kernel

SHAPES = [  # (what, s, b, heads, head dim); hidden = heads x head dim
    ("GPT-2 XL, row 111 (15 x 1024 tokens, hidden 1600)", 1024, 15, 25, 64),
    ("GPT-2 24 x 2048 (not a catalog row; 15 x 1024 tokens)", 1024, 15, 16, 128),
    ("GPT-2 XL at micro-batch 14 (not a catalog row)", 1024, 14, 25, 64),
]


@triton.jit
def _norm_bwd(x_ptr, w_ptr, dy_ptr, dr_ptr, dx_ptr, mean_ptr, rstd_ptr, dw_ptr, db_ptr, rows, n, rows_per_program,
              BLOCK: tl.constexpr, STAGES: tl.constexpr, EARLY: tl.constexpr):
    """triton_norm.norm_backward for LayerNorm with a bias and the residual's gradient (HAS_RES)."""
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
        x = tl.load(x_ptr + off + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + off + cols, mask=mask, other=0.0).to(tl.float32)
        if EARLY:
            dr = tl.load(dr_ptr + off + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row)
        xhat = tl.where(mask, (x - tl.load(mean_ptr + row)) * rstd, 0.0)
        wdy = gamma * dy
        c1 = tl.sum(xhat * wdy, axis=0) / n
        c2 = tl.sum(wdy, axis=0) / n
        dx = (wdy - (xhat * c1 + c2)) * rstd
        if EARLY:
            dx += dr
        else:
            dx += tl.load(dr_ptr + off + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(dx_ptr + off + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += dy * xhat
        db += dy
    tl.store(dw_ptr + pid * n + cols, dw, mask=mask)
    tl.store(db_ptr + pid * n + cols, db, mask=mask)


@triton.jit
def _gelu_bwd(g_ptr, y_ptr, b_ptr, dx_ptr, part_ptr, rows, n, rows_per_program, BLOCK_R: tl.constexpr,
              BLOCK_C: tl.constexpr, STAGES: tl.constexpr):
    """bias_gelu.bias_gelu_backward, its loop a tl.range."""
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
        g = tl.load(g_ptr + offs, mask=m, other=0.0).to(tl.float32)
        x = tl.load(y_ptr + offs, mask=m, other=0.0).to(tl.float32) + bias[None, :]
        t = 2.0 * tl.sigmoid(2.0 * (0.79788456 * x * (1.0 + 0.044715 * x * x))) - 1.0
        ff = 0.5 * x * ((1.0 - t * t) * (0.79788456 + 0.1070322243 * x * x)) + 0.5 * (1.0 + t)
        dx = tl.where(m, ff * g, 0.0)
        tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=m)
        acc += dx
    tl.store(part_ptr + pid_r * n + cols, tl.sum(acc, axis=0), mask=cmask)


@triton.jit
def pack(src, out_ptr, part_ptr, tokens, batch, heads, tokens_per_program, s_s, s_b, s_h, width, W, off,
          BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr, STAGES: tl.constexpr):
    """qkv_split.pack with its sums, its loop a tl.range."""
    pid_t = tl.program_id(0)
    head = tl.program_id(1)
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
        x = tl.load(src + (s * s_s + b * s_b + head * s_h)[:, None] + cols[None, :], mask=m, other=0.0)
        tl.store(out_ptr + (t.to(tl.int64) * heads * W + head * W + off)[:, None] + cols[None, :], x, mask=m)
        acc += x.to(tl.float32)
    tl.store(part_ptr + pid_t * heads * W + head * W + off + cols, tl.sum(acc, axis=0), mask=cmask)


@triton.jit
def _quarter(groups, k: tl.constexpr, last, rows, n, cols, cmask):
    r = groups * 4 + k
    m = (groups[:, None] < last) & (r[:, None] < rows) & cmask[None, :]
    return r[:, None].to(tl.int64) * n + cols[None, :], m


@triton.jit
def _bda_bwd(g_ptr, dx_ptr, seed_ptr, part_ptr, rows, n, p, scale, groups_per_program, GROUPS: tl.constexpr,
             BLOCK_C: tl.constexpr, STAGES: tl.constexpr, FIRST: tl.constexpr):
    """dropout_add.bda_backward with a bias; FIRST: the four rows' loads before any store."""
    pid_r = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < n
    seed = tl.load(seed_ptr)
    acc = tl.zeros((GROUPS, BLOCK_C), dtype=tl.float32)
    first = pid_r * groups_per_program
    last = tl.minimum(first + groups_per_program, tl.cdiv(rows, 4))
    for g0 in tl.range(first, last, GROUPS, num_stages=STAGES):
        groups = g0 + tl.arange(0, GROUPS)
        draws = tl.randint4x(seed, groups[:, None] * n + cols[None, :])
        if FIRST:
            o0, m0 = _quarter(groups, 0, last, rows, n, cols, cmask)
            o1, m1 = _quarter(groups, 1, last, rows, n, cols, cmask)
            o2, m2 = _quarter(groups, 2, last, rows, n, cols, cmask)
            o3, m3 = _quarter(groups, 3, last, rows, n, cols, cmask)
            a0 = tl.load(g_ptr + o0, mask=m0, other=0.0).to(tl.float32)
            a1 = tl.load(g_ptr + o1, mask=m1, other=0.0).to(tl.float32)
            a2 = tl.load(g_ptr + o2, mask=m2, other=0.0).to(tl.float32)
            a3 = tl.load(g_ptr + o3, mask=m3, other=0.0).to(tl.float32)
            d0 = tl.where((tl.uint_to_uniform_float(draws[0]) >= p) & m0, a0 * scale, 0.0)
            d1 = tl.where((tl.uint_to_uniform_float(draws[1]) >= p) & m1, a1 * scale, 0.0)
            d2 = tl.where((tl.uint_to_uniform_float(draws[2]) >= p) & m2, a2 * scale, 0.0)
            d3 = tl.where((tl.uint_to_uniform_float(draws[3]) >= p) & m3, a3 * scale, 0.0)
            tl.store(dx_ptr + o0, d0.to(dx_ptr.dtype.element_ty), mask=m0)
            tl.store(dx_ptr + o1, d1.to(dx_ptr.dtype.element_ty), mask=m1)
            tl.store(dx_ptr + o2, d2.to(dx_ptr.dtype.element_ty), mask=m2)
            tl.store(dx_ptr + o3, d3.to(dx_ptr.dtype.element_ty), mask=m3)
            acc += (d0 + d1) + (d2 + d3)
        else:
            for k in tl.static_range(4):
                offs, m = _quarter(groups, k, last, rows, n, cols, cmask)
                keep = tl.uint_to_uniform_float(draws[k]) >= p
                g = tl.load(g_ptr + offs, mask=m, other=0.0).to(tl.float32)
                dx = tl.where(keep & m, g * scale, 0.0)
                tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=m)
                acc += dx
    tl.store(part_ptr + pid_r * n + cols, tl.sum(acc, axis=0), mask=cmask)


@triton.jit
def _bda_fwd(x_ptr, b_ptr, r_ptr, out_ptr, seed_ptr, rows, n, p, scale, groups_per_program, GROUPS: tl.constexpr,
             BLOCK_C: tl.constexpr, STAGES: tl.constexpr):
    """dropout_add.bda_forward with a bias, walking groups_per_program row groups, the four rows' loads first."""
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < n
    seed = tl.load(seed_ptr)
    bias = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    first = tl.program_id(0) * groups_per_program
    last = tl.minimum(first + groups_per_program, tl.cdiv(rows, 4))
    for g0 in tl.range(first, last, GROUPS, num_stages=STAGES):
        groups = g0 + tl.arange(0, GROUPS)
        draws = tl.randint4x(seed, groups[:, None] * n + cols[None, :])
        o0, m0 = _quarter(groups, 0, last, rows, n, cols, cmask)
        o1, m1 = _quarter(groups, 1, last, rows, n, cols, cmask)
        o2, m2 = _quarter(groups, 2, last, rows, n, cols, cmask)
        o3, m3 = _quarter(groups, 3, last, rows, n, cols, cmask)
        x0 = tl.load(x_ptr + o0, mask=m0, other=0.0).to(tl.float32) + bias[None, :]
        x1 = tl.load(x_ptr + o1, mask=m1, other=0.0).to(tl.float32) + bias[None, :]
        x2 = tl.load(x_ptr + o2, mask=m2, other=0.0).to(tl.float32) + bias[None, :]
        x3 = tl.load(x_ptr + o3, mask=m3, other=0.0).to(tl.float32) + bias[None, :]
        y0 = tl.load(r_ptr + o0, mask=m0, other=0.0).to(tl.float32)
        y1 = tl.load(r_ptr + o1, mask=m1, other=0.0).to(tl.float32)
        y2 = tl.load(r_ptr + o2, mask=m2, other=0.0).to(tl.float32)
        y3 = tl.load(r_ptr + o3, mask=m3, other=0.0).to(tl.float32)
        y0 += tl.where(tl.uint_to_uniform_float(draws[0]) >= p, x0 * scale, 0.0)
        y1 += tl.where(tl.uint_to_uniform_float(draws[1]) >= p, x1 * scale, 0.0)
        y2 += tl.where(tl.uint_to_uniform_float(draws[2]) >= p, x2 * scale, 0.0)
        y3 += tl.where(tl.uint_to_uniform_float(draws[3]) >= p, x3 * scale, 0.0)
        tl.store(out_ptr + o0, y0.to(out_ptr.dtype.element_ty), mask=m0)
        tl.store(out_ptr + o1, y1.to(out_ptr.dtype.element_ty), mask=m1)
        tl.store(out_ptr + o2, y2.to(out_ptr.dtype.element_ty), mask=m2)
        tl.store(out_ptr + o3, y3.to(out_ptr.dtype.element_ty), mask=m3)


@triton.jit
def sum_rows(part_ptr, out_ptr, rows, n, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, STAGES: tl.constexpr):
    """param_grad.sum_rows for one table, added into an fp32 main_grad, its loop a tl.range."""
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < n
    acc = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    for r0 in tl.range(0, rows, BLOCK_R, num_stages=STAGES):
        r = r0 + tl.arange(0, BLOCK_R)
        acc += tl.load(part_ptr + r[:, None] * n + cols[None, :], mask=(r[:, None] < rows) & cmask[None, :],
                       other=0.0)
    total = tl.sum(acc, axis=0) + tl.load(out_ptr + cols, mask=cmask, other=0.0)
    tl.store(out_ptr + cols, total, mask=cmask)


def grid_rows(rows, block, per_sm, col_programs, sms):
    """(row programs, rows each) as bias_gelu and qkv_split size their grids."""
    programs = max(1, min(triton.cdiv(rows, block), triton.cdiv(sms * per_sm, col_programs)))
    per = triton.cdiv(rows, programs)
    return triton.cdiv(rows, per), per


def report(label, fn, out, ref):
    t = gpu_us(fn)
    fn()
    diff = (out.float() - ref.float()).abs().max().item()
    print(f"  {label:44s} {t[0]:6.1f} us ({t[1]:.0f} kernels); differs by {diff:.3g}")


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
    print(f" norm backward: moves {4 * x.numel() * 2 / 1e6:.0f} MB ({4 * x.numel() * 2 / 3.35e6:.0f} us at 3.35 TB/s)")

    def run(stages, early, per_sm, shipped=False):
        programs = max(1, min(-(-rows // triton_norm.MIN_ROWS), sms * per_sm))
        per = triton.cdiv(rows, programs)
        programs = triton.cdiv(rows, per)
        parts = param_grad.tables(2, programs, n, "cuda")

        def f():
            if shipped:
                kernel(triton_norm.norm_backward)[(programs,)](
                    x, w, dy, dr, dx, mean, rstd, parts[0], parts[1], rows, n, per, RMS=False, HAS_BIAS=True,
                    SHIFTED=False, HAS_RES=True, BLOCK=block, STAGES=triton_norm.STAGES,
                    num_warps=triton_norm.warps(block))
            else:
                _norm_bwd[(programs,)](x, w, dy, dr, dx, mean, rstd, parts[0], parts[1], rows, n, per, BLOCK=block,
                                       STAGES=stages, EARLY=early, num_warps=triton_norm.warps(block))
            param_grad.reduce([w, b], parts)
        return f

    run(1, False, 4, shipped=True)()
    ref = dx.clone()
    report("shipped", run(1, False, 4, shipped=True), dx, ref)
    for stages, early, per_sm in ((1, False, 4), (2, False, 4), (3, False, 4), (1, True, 4), (2, True, 4),
                                  (3, True, 4), (4, False, 4), (4, True, 4), (3, True, 2), (3, True, 8)):
        label = f"{stages} stages{', early residual' if early else ''}, {per_sm}/SM"
        report(label, run(stages, early, per_sm), dx, ref)


def gelu(rows, n, sms):
    g, y = (torch.randn(rows, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    bias = torch.nn.Parameter(torch.randn(n, device="cuda", dtype=torch.bfloat16))
    bias.main_grad = torch.zeros(n, device="cuda", dtype=torch.float32)
    bias.grad_added_to_main_grad = False
    dx = torch.empty_like(y)
    col_blocks = triton.cdiv(n, bias_gelu.BLOCK_COLS)
    programs, per = grid_rows(rows, bias_gelu.BLOCK_ROWS, bias_gelu.PROGRAMS_PER_SM, col_blocks, sms)
    parts = param_grad.tables(1, programs, n, "cuda")
    print(f" bias_gelu backward: moves {3 * y.numel() * 2 / 1e6:.0f} MB ({3 * y.numel() * 2 / 3.35e6:.0f} us at "
          "3.35 TB/s)")

    def run(stages, shipped=False):
        def f():
            if shipped:
                kernel(bias_gelu.bias_gelu_backward)[(programs, col_blocks)](
                    g, y, bias, dx, parts[0], rows, n, per, BLOCK_R=bias_gelu.BLOCK_ROWS,
                    BLOCK_C=bias_gelu.BLOCK_COLS, num_warps=bias_gelu.WARPS)
            else:
                _gelu_bwd[(programs, col_blocks)](g, y, bias, dx, parts[0], rows, n, per, BLOCK_R=bias_gelu.BLOCK_ROWS,
                                                  BLOCK_C=bias_gelu.BLOCK_COLS, STAGES=stages,
                                                  num_warps=bias_gelu.WARPS)
            param_grad.reduce([bias], parts)
        return f

    run(1, shipped=True)()
    ref = dx.clone()
    report("shipped", run(1, shipped=True), dx, ref)
    for stages in (1, 2, 3, 4):
        report(f"{stages} stages", run(stages), dx, ref)


def pack(s, b, heads, hn, sms):
    mixed = torch.randn(s, b, heads, 3 * hn, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    q, k, v = torch.split(mixed, [hn, hn, hn], dim=3)
    out = F.scaled_dot_product_attention(*(t.permute(1, 2, 0, 3) for t in (q, k, v)), is_causal=True)
    pieces = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))  # the strides cuDNN's backward gives
    tokens, W = s * b, 3 * hn
    programs, per = grid_rows(tokens, qkv_split.BLOCK_TOKENS, qkv_split.PROGRAMS_PER_SM, heads, sms)
    packed = torch.empty(s, b, heads, W, device="cuda", dtype=torch.bfloat16)
    parts = param_grad.tables(1, programs, heads * W, "cuda")
    bias = torch.empty(heads * W, device="cuda", dtype=torch.bfloat16)
    print(f" qkv_pack backward: moves {2 * packed.numel() * 2 / 1e6:.0f} MB ({2 * packed.numel() * 2 / 3.35e6:.0f} us"
          " at 3.35 TB/s)")

    def run(stages, shipped=False):
        def f():
            if shipped:  # since the grid-tuning microbenchmark: the three pieces in one launch
                strides = [x for g in pieces for x in g.stride()[:3]]
                kernel(qkv_split.pack)[(programs, heads, 3)](*pieces, packed, parts, tokens, b, heads, per, *strides,
                                                              hn, hn, W, SUMS=True, BLOCK_T=qkv_split.BLOCK_TOKENS,
                                                              BLOCK_W=triton.next_power_of_2(hn),
                                                              num_warps=qkv_split.WARPS)
            else:
                off = 0
                for g in pieces:
                    args = (g, packed, parts, tokens, b, heads, per, g.stride(0), g.stride(1), g.stride(2), hn, W, off)
                    pack[(programs, heads)](*args, BLOCK_T=qkv_split.BLOCK_TOKENS, BLOCK_W=triton.next_power_of_2(hn),
                                             STAGES=stages, num_warps=qkv_split.WARPS)
                    off += hn
            param_grad.reduce([bias], parts)
        return f

    run(1, shipped=True)()
    ref = packed.clone()
    report("shipped", run(1, shipped=True), packed, ref)
    for stages in (1, 2, 3, 4):
        report(f"{stages} stages", run(stages), packed, ref)


def dropout(rows, n):
    g = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
    bias = torch.nn.Parameter(torch.randn(n, device="cuda", dtype=torch.bfloat16))
    bias.main_grad = torch.zeros(n, device="cuda", dtype=torch.float32)
    bias.grad_added_to_main_grad = False
    seed = torch.tensor([12345], device="cuda", dtype=torch.int64)
    dx = torch.empty_like(g)
    col_blocks = triton.cdiv(n, dropout_add.BLOCK_COLS)
    print(f" dropout_add backward: moves {2 * g.numel() * 2 / 1e6:.0f} MB ({2 * g.numel() * 2 / 3.35e6:.0f} us at "
          "3.35 TB/s)")

    def run(stages, first, tiles, shipped=False):
        per = dropout_add.ROW_GROUPS * tiles
        programs = triton.cdiv(triton.cdiv(rows, 4), per)
        parts = param_grad.tables(1, programs, n, "cuda")

        def f():
            args = (g, dx, seed, parts, rows, n, 0.1, 1 / 0.9, per)
            if shipped:
                kernel(dropout_add.bda_backward)[(programs, col_blocks)](
                    *args, HAS_BIAS=True, GROUPS=dropout_add.ROW_GROUPS, BLOCK_C=dropout_add.BLOCK_COLS,
                    STAGES=dropout_add.STAGES, num_warps=dropout_add.WARPS)
            else:
                _bda_bwd[(programs, col_blocks)](*args, GROUPS=dropout_add.ROW_GROUPS, BLOCK_C=dropout_add.BLOCK_COLS,
                                                 STAGES=stages, FIRST=first, num_warps=dropout_add.WARPS)
            param_grad.reduce([bias], parts)
        return f

    tiles = dropout_add.TILES_PER_PROGRAM
    run(1, False, tiles, shipped=True)()
    ref = dx.clone()
    report("shipped", run(1, False, tiles, shipped=True), dx, ref)
    for stages, first, tiles in ((1, False, 2), (1, True, 2), (2, False, 4), (2, True, 4), (3, True, 4),
                                 (2, True, 8), (3, True, 8), (4, True, 8), (3, True, 16), (1, True, 1)):
        label = f"{stages} stages{', 4 loads first' if first else ''}, {tiles} tiles"
        report(label, run(stages, first, tiles), dx, ref)


def dropout_forward(rows, n):
    x, r = (torch.randn(rows, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    seed = torch.tensor([12345], device="cuda", dtype=torch.int64)
    out = torch.empty_like(x)
    col_blocks = triton.cdiv(n, dropout_add.BLOCK_COLS)
    print(f" dropout_add forward: moves {3 * x.numel() * 2 / 1e6:.0f} MB ({3 * x.numel() * 2 / 3.35e6:.0f} us at "
          "3.35 TB/s)")

    def run(stages, tiles, shipped=False):
        per = dropout_add.ROW_GROUPS * tiles
        programs = triton.cdiv(triton.cdiv(rows, 4), per)

        def f():
            if shipped:
                kernel(dropout_add.bda_forward)[(programs, col_blocks)](
                    x, bias, r, out, seed, rows, n, 0.1, 1 / 0.9, HAS_BIAS=True, GROUPS=dropout_add.ROW_GROUPS,
                    BLOCK_C=dropout_add.BLOCK_COLS, num_warps=dropout_add.WARPS)
            else:
                _bda_fwd[(programs, col_blocks)](x, bias, r, out, seed, rows, n, 0.1, 1 / 0.9, per,
                                                 GROUPS=dropout_add.ROW_GROUPS, BLOCK_C=dropout_add.BLOCK_COLS,
                                                 STAGES=stages, num_warps=dropout_add.WARPS)
        return f

    run(1, 1, shipped=True)()
    ref = out.clone()
    report("shipped", run(1, 1, shipped=True), out, ref)
    for stages, tiles in ((1, 1), (2, 2), (2, 4), (3, 4), (3, 8)):
        report(f"{stages} stages, 4 loads first, {tiles} tiles", run(stages, tiles), out, ref)


def sums(rows, n, sms):
    """param_grad's reduction alone, at the table each kernel leaves at this shape (as shipped at 7f7d795)."""
    heads_w = 3 * n
    tables = [("norm's (x2)", max(1, min(-(-rows // triton_norm.MIN_ROWS), sms * triton_norm.PROGRAMS_PER_SM)), n, 2),
              ("bias_gelu's", grid_rows(rows, bias_gelu.BLOCK_ROWS, bias_gelu.PROGRAMS_PER_SM,
                                        triton.cdiv(4 * n, bias_gelu.BLOCK_COLS), sms)[0], 4 * n, 1),
              ("dropout_add's, 2 tiles", triton.cdiv(triton.cdiv(rows, 4), 2 * dropout_add.ROW_GROUPS), n, 1),
              ("dropout_add's, 8 tiles", triton.cdiv(triton.cdiv(rows, 4), 8 * dropout_add.ROW_GROUPS), n, 1)]
    for what, programs, width, count in tables:
        parts = torch.randn(count, programs, width, device="cuda", dtype=torch.float32)
        params = [torch.nn.Parameter(torch.zeros(width, device="cuda", dtype=torch.bfloat16)) for _ in range(count)]
        for p in params:
            p.main_grad = torch.zeros(width, device="cuda", dtype=torch.float32)
            p.grad_added_to_main_grad = False
        print(f" param_grad's reduction of {what} table, {programs} x {width} fp32")

        def run(block_r, block_c, stages, shipped=False):
            def f():
                if shipped:
                    param_grad.reduce(params, parts)
                else:
                    for i, p in enumerate(params):
                        sum_rows[(triton.cdiv(width, block_c),)](parts[i], p.main_grad, programs, width,
                                                                  BLOCK_R=block_r, BLOCK_C=block_c, STAGES=stages,
                                                                  num_warps=4)
            return f

        for p in params:
            p.main_grad.zero_()
        run(0, 0, 0, shipped=True)()
        ref = params[0].main_grad.clone()
        print(f"  {'shipped':44s} {gpu_us(run(0, 0, 0, shipped=True))[0]:6.1f} us")
        for block_r, block_c, stages in ((64, 64, 1), (64, 32, 1), (32, 32, 1), (64, 16, 1), (32, 16, 1), (64, 32, 3),
                                         (32, 16, 3), (64, 16, 3)):
            for p in params:
                p.main_grad.zero_()
            run(block_r, block_c, stages)()
            diff = (params[0].main_grad - ref).abs().max().item()
            t = gpu_us(run(block_r, block_c, stages))
            print(f"  {f'{block_r} x {block_c} columns, {stages} stages':44s} {t[0]:6.1f} us ({t[1]:.0f} kernels); "
                  f"differs by {diff:.3g}")


def main():
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    print(torch.cuda.get_device_name(), getattr(props, "uuid", ""), f"{sms} SMs")
    for what, s, b, heads, hn in SHAPES:
        rows, n = s * b, heads * hn
        print(what)
        norm(rows, n, sms)
        gelu(rows, 4 * n, sms)
        pack(s, b, heads, hn, sms)
        dropout(rows, n)
        dropout_forward(rows, n)
        sums(rows, n, sms)
    print(f"torch {torch.__version__}, triton {triton.__version__}")


if __name__ == "__main__":
    main()
