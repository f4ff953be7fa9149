"""AdamW over flat buffers in one kernel that also writes the bf16 weights (lever `flat_adam`).

Why. With bf16 weights Megatron keeps an fp32 master copy of each one (Float16OptimizerWithFloat16Params)
and a step is two passes over every parameter: torch's fused AdamW updates the masters (its multi-tensor
kernel, chunked over ~580 separate tensors at GPT-2 XL), then Megatron copies each master into its bf16
weight, one `copy_` per tensor (580 launches); both show in row 101's profile
(results/bench/README.md#where-a-step-goes-profiles).

What this does instead. Megatron's DDP already keeps every fp32 main_grad as a view into one flat buffer
(its grad buffer). At the optimizer's construction, before any step or CUDA graph, the fp32 masters and
the bf16 weights are moved into flat buffers laid out exactly like that grad buffer (same offset for the
same parameter; the buffer's padding is never touched), and each tensor becomes a view there; AdamW's two
moments follow at the first step, when torch would make them (made earlier, they sat on top of the first
step's activations and raised the peak). A step is then one Triton kernel per buffer: read
master, grad, m, v (16 bytes a parameter), write master, m, v and the bf16 weight (14), the update torch's fused
AdamW computes (weight decay per parameter group, gradient clipping's coefficient from clip_in_adam), and Megatron's
master-to-weight copy is skipped for that step. A chunk table (start, length, group) written once tells
each program its slice, so no chunk crosses two parameters. Gradient clipping's norm (foreach_norm) reads
the same table in one kernel too, where it is asked for exactly those gradients (grad_norm).

Scope. Only Megatron's Float16OptimizerWithFloat16Params around megalab's FusedAdamW (fused_adam), with
every main_grad in a DDP buffer, at most four parameter groups sharing betas and eps, no amsgrad or
maximize, CUDA tensors. Anything else keeps torch's fused kernel and Megatron's copy, unchanged. A step
where a gradient is not the expected buffer view (Megatron reassigns them every step; a change means
something else owns them) falls back to torch for good. Optimizer state stays torch's: per-parameter
`exp_avg`, `exp_avg_sq` and `step` (views and tensors), so checkpoints save and load as before; a load
copies the loaded state into the flat buffers. Exactness: tests/test_flat_adam.py.
"""
from __future__ import annotations

import math
import os
import weakref

import torch

from megalab.runtime import jit

BLOCK = 2048  # elements per program and per chunk of the table, with 8 warps (results/bench/flat-adam-microbench.txt)
MAX_GROUPS = 4  # per-group lr and weight decay travel as scalar kernel arguments

try:  # Triton comes with CUDA torch (and megalab's CPU venv: Megatron imports it); without it, no lever
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None


def _adamw_flat(p_ptr, g_ptr, m_ptr, v_ptr, out_ptr, starts_ptr, counts_ptr, groups_ptr, scale_ptr,
                lr0, wd0, lr1, wd1, lr2, wd2, lr3, wd3, beta1, beta2, eps, bc1, bc2_sqrt,
                HAS_SCALE: tl.constexpr, BLOCK: tl.constexpr):
    """One chunk of the table: AdamW on master, m, v and the weight's bf16 copy, in place."""
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
    if HAS_SCALE:  # clip_in_adam's coefficient: torch's fused AdamW divides by grad_scale (here: times 1/scale)
        g = g * (1.0 / tl.load(scale_ptr))
    # torch's fused AdamW (ATen fused_adam_utils.cuh, ADAMW mode), step for step, with its IEEE-rounded square
    # root and division (sqrt_rn, div_rn: also the variant that kept the bandwidth,
    # results/bench/flat-adam-microbench.txt)
    p = p - lr * wd * p
    m = beta1 * m + (1.0 - beta1) * g
    v = beta2 * v + (1.0 - beta2) * g * g
    denom = tl.div_rn(tl.sqrt_rn(v), bc2_sqrt) + eps
    p = p - tl.div_rn((lr / bc1) * m, denom)
    tl.store(p_ptr + offs, p, mask=mask)
    tl.store(m_ptr + offs, m, mask=mask)
    tl.store(v_ptr + offs, v, mask=mask)
    tl.store(out_ptr + offs, p.to(out_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mask)


def _sum_of_squares(g_ptr, starts_ptr, counts_ptr, out_ptr, BLOCK: tl.constexpr):
    """One chunk's sum of squared gradients (the clip's norm, over the same table: padding never read)."""
    pid = tl.program_id(0)
    start = tl.load(starts_ptr + pid)
    count = tl.load(counts_ptr + pid)
    idx = tl.arange(0, BLOCK)
    g = tl.load(g_ptr + start + idx, mask=idx < count, other=0.0)
    tl.store(out_ptr + pid, tl.sum(g * g, axis=0))


def _kernel(fn=None):
    return jit.kernel(fn or _adamw_flat)


_SPACES: "weakref.WeakValueDictionary[int, _Space]" = weakref.WeakValueDictionary()  # grad storage -> space


def grad_norm(tensors: list) -> torch.Tensor | None:
    """The L2 norm of `tensors` as a 1-element fp32 tensor, when they are exactly the gradients of one or more
    flat spaces (Megatron's clip asks for all of a one-GPU model's); None otherwise (the caller's own way)."""
    if not _SPACES or not tensors:
        return None
    cached = _NORM_CACHE[0] if _NORM_CACHE else None
    if cached is not None and len(cached[0]) == len(tensors) and all(a is b for a, b in zip(cached[0], tensors)):
        spaces = [s for s in (r() for r in cached[1]) if s is not None]
        if len(spaces) == len(cached[1]):
            return _norm(spaces)
    by_storage: dict = {}
    for t in tensors:
        by_storage.setdefault(t.untyped_storage().data_ptr(), []).append(t)
    spaces = []
    for ptr, members in by_storage.items():
        space = _SPACES.get(ptr)
        if (space is None or len(members) != len(space.mains) or sum(t.numel() for t in members) != space.numel
                or {t.data_ptr() for t in members} != space.grad_ptrs
                or any(t.dtype != torch.float32 for t in members)):
            _once("norm", f"the clip's norm stays foreach: its {len(tensors)} tensors are not exactly a flat "
                          "buffer's gradients")
            return None
        spaces.append(space)
    _NORM_CACHE[:] = [(list(tensors), [weakref.ref(s) for s in spaces])]  # Megatron asks with the same tensors
    _once("norm", f"the clip's norm over {len(spaces)} flat buffer(s) in one kernel each")
    return _norm(spaces)


_NORM_CACHE: list = []  # [(the tensors last asked for, held so their ids stay theirs; their spaces)]


def _norm(spaces: list) -> torch.Tensor:
    partials = []
    for space in spaces:
        out = torch.empty(space.starts.numel(), dtype=torch.float32, device=space.grad.device)
        _kernel(_sum_of_squares)[(out.numel(),)](space.grad, space.starts, space.counts, out, BLOCK=BLOCK,
                                                  num_warps=8)
        partials.append(out.sum())
    return torch.stack(partials).sum().sqrt().reshape(1)


_SAID: set = set()


def _once(key: str, line: str) -> None:
    if key not in _SAID:
        _SAID.add(key)
        _say(f"flat_adam: {line}")


class _Space:
    """One flat buffer's worth: the grad buffer (Megatron's), the masters, moments and weights (ours)."""

    def __init__(self, grad: torch.Tensor, master: torch.Tensor, weight: torch.Tensor, table: tuple,
                 mains: list, expected: list):
        self.grad, self.master, self.weight = grad, master, weight
        self.exp_avg = self.exp_avg_sq = None  # made at the first step, as torch makes its state (_moments)
        self.starts, self.counts, self.groups = table
        self.mains = mains  # the fp32 masters, and the main_grad each must have as .grad (checked every step)
        self.expected = expected
        self.grad_ptrs = frozenset(g.data_ptr() for g in self.expected)
        self.numel = sum(g.numel() for g in self.expected)

    def grads_in_place(self) -> bool:
        """Each master's .grad is its main_grad view: Megatron hands the same tensor every step (a quick
        identity check), or at least one at the same address."""
        if all(m.grad is g for m, g in zip(self.mains, self.expected)):
            return True
        return all(m.grad is not None and m.grad.data_ptr() == g.data_ptr() for m, g in zip(self.mains, self.expected))


def _flat_of(t: torch.Tensor) -> torch.Tensor:
    """The whole storage `t` views, as a flat tensor of t's dtype."""
    storage = t.untyped_storage()
    n = storage.nbytes() // t.element_size()
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(storage, 0, (n,))


def why_not(optimizer: torch.optim.Optimizer, pairs: list) -> str | None:
    """Why `pairs` (fp32 master, bf16 weight) of `optimizer` cannot go flat, or None if they can."""
    groups = optimizer.param_groups
    if not pairs:
        return "no bf16 weights"
    if len(groups) > MAX_GROUPS:
        return f"{len(groups)} parameter groups (at most {MAX_GROUPS})"
    masters = {id(p) for g in groups for p in g["params"]}
    if masters != {id(main) for main, _ in pairs}:
        return "the optimizer holds parameters that are not fp32 masters of bf16 weights"
    for key in ("betas", "eps"):
        if len({tuple(g[key]) if key == "betas" else g[key] for g in groups}) != 1:
            return f"parameter groups with different {key}"
    if any(g.get("amsgrad") or g.get("maximize") or g.get("capturable") or g.get("differentiable") for g in groups):
        return "amsgrad, maximize, capturable or differentiable AdamW"
    for main, model in pairs:
        mg = getattr(model, "main_grad", None)
        if mg is None or mg.dtype != torch.float32 or not mg.is_contiguous() or mg.numel() != model.numel():
            return "a weight without an fp32 main_grad in a DDP buffer"
        if main.dtype != torch.float32 or model.dtype not in (torch.bfloat16, torch.float16):
            return "a master that is not fp32 or a weight that is not bf16/fp16"
        if main.device != mg.device or model.device != mg.device:
            return "tensors on different devices"
        if not mg.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":  # the CPU tests run the interpreter
            return "tensors off the GPU"
    return None


def table(entries: list, device) -> tuple:
    """Chunks of at most BLOCK elements, none crossing a parameter: (starts int64, counts int32, groups int32)."""
    starts, counts, groups = [], [], []
    for offset, n, group in entries:
        k = torch.arange(0, n, BLOCK, dtype=torch.int64)
        starts.append(k + offset)
        counts.append(torch.clamp(n - k, max=BLOCK).to(torch.int32))
        groups.append(torch.full((len(k),), group, dtype=torch.int32))
    return (torch.cat(starts).to(device), torch.cat(counts).to(device), torch.cat(groups).to(device))


def adopt(optimizer: torch.optim.Optimizer, pairs: list) -> bool:
    """Move the masters and weights of `pairs` into flat buffers shaped like their grad buffers (the moments
    follow at the first step) and hand the optimizer the flat step. False (nothing changed) where why_not()
    gives a reason or two main_grads overlap in their buffer."""
    reason = "Triton is not installed" if triton is None else why_not(optimizer, pairs)
    if reason is not None:
        optimizer.flat_adam_off = reason
        return False
    group_of = {id(p): i for i, g in enumerate(optimizer.param_groups) for p in g["params"]}
    by_storage: dict = {}
    for main, model in pairs:
        by_storage.setdefault(model.main_grad.untyped_storage().data_ptr(), []).append((main, model))
    for members in by_storage.values():  # every buffer checked before any tensor moves
        spans = sorted((m.main_grad.storage_offset(), m.numel()) for _, m in members)
        if any(a + n > b for (a, n), (b, _) in zip(spans, spans[1:])):
            optimizer.flat_adam_off = "main_grads that overlap in their buffer"
            return False
    spaces = []
    shared = _step_tensor(optimizer, pairs[0][0])
    with torch.no_grad():
        for members in by_storage.values():
            grad = _flat_of(members[0][1].main_grad)
            size = grad.numel()
            master = torch.zeros(size, dtype=torch.float32, device=grad.device)
            weight = torch.zeros(size, dtype=members[0][1].dtype, device=grad.device)
            entries = []
            for main, model in members:
                off, n = model.main_grad.storage_offset(), model.numel()
                master[off:off + n].copy_(main.reshape(-1))
                main.data = master[off:off + n].view_as(main)
                weight[off:off + n].copy_(model.reshape(-1))
                model.data = weight[off:off + n].view_as(model)
                entries.append((off, n, group_of[id(main)]))
            spaces.append(_Space(grad, master, weight, table(entries, grad.device),
                                 [main for main, _ in members], [model.main_grad for _, model in members]))
            _SPACES[grad.untyped_storage().data_ptr()] = spaces[-1]
    optimizer.flat_adam = spaces
    optimizer.flat_adam_step_t = shared
    for space in spaces:
        if any(optimizer.state[main].get("exp_avg") is not None for main in space.mains):
            _moments(optimizer, space)  # a state that came before: into the flat moments now
    optimizer.flat_adam_off = None
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the per-tensor copies just freed: back to the driver, not left as holes
    return True


def _step_tensor(optimizer, main) -> torch.Tensor:
    """One fp32 step count on the device for every parameter, from the state's count where it has one."""
    step = optimizer.state[main].get("step") if main in optimizer.state else None
    return torch.tensor(float(step or 0.0), dtype=torch.float32, device=main.device)


def _moments(optimizer, space) -> None:
    """The space's flat moments, made at its first step as torch's AdamW makes its state then (memory the
    first step's activations freed, not memory on top of them), and each parameter's state as views of them,
    with any values it had (a loaded checkpoint) copied in; every parameter's step is the one shared count."""
    with torch.no_grad():
        if space.exp_avg is None:
            space.exp_avg = torch.zeros_like(space.master)
            space.exp_avg_sq = torch.zeros_like(space.master)
        for main in space.mains:
            off, n = main.storage_offset(), main.numel()
            state = optimizer.state[main]
            for key, flat in (("exp_avg", space.exp_avg), ("exp_avg_sq", space.exp_avg_sq)):
                view = flat[off:off + n].view_as(main)
                old = state.get(key)
                if old is not None and old.data_ptr() != view.data_ptr():
                    view.copy_(old.reshape(main.shape))
                state[key] = view
            state["step"] = optimizer.flat_adam_step_t


def readopt(optimizer) -> None:
    """After a state load: the loaded moments copied into the flat buffers, the state views again."""
    spaces = getattr(optimizer, "flat_adam", None)
    if not spaces:
        return
    optimizer.flat_adam_step = None
    with torch.no_grad():
        optimizer.flat_adam_step_t.fill_(float(optimizer.state[spaces[0].mains[0]].get("step", 0.0)))
    for space in spaces:
        _moments(optimizer, space)


def step(optimizer) -> bool:
    """One AdamW step over the flat buffers; False (and nothing done) where this step is not flat."""
    spaces = getattr(optimizer, "flat_adam", None)
    if not spaces:
        return False
    if not all(space.grads_in_place() for space in spaces):
        _off(optimizer, "a gradient that is not its DDP buffer view")
        return False
    for space in spaces:
        if space.exp_avg is None:
            _moments(optimizer, space)
    groups = optimizer.param_groups
    beta1, beta2 = groups[0]["betas"]
    eps = groups[0]["eps"]
    shared = optimizer.flat_adam_step_t  # every parameter's state["step"]: one tensor, as all step together
    n = getattr(optimizer, "flat_adam_step", None)
    if n is None:  # the first flat step, or the first after a load: the count from the state, once
        n = int(shared.item())
    n += 1
    shared.add_(1.0)
    optimizer.flat_adam_step = n
    bc1 = 1.0 - beta1 ** n
    bc2_sqrt = math.sqrt(1.0 - beta2 ** n)
    hyper = []
    for i in range(MAX_GROUPS):
        g = groups[min(i, len(groups) - 1)]
        hyper += [float(g["lr"]), float(g["weight_decay"])]
    scale = getattr(optimizer, "grad_scale", None)
    kernel = _kernel()
    for space in spaces:
        grid = (space.starts.numel(),)
        kernel[grid](space.master, space.grad, space.exp_avg, space.exp_avg_sq, space.weight,
                     space.starts, space.counts, space.groups, scale if scale is not None else space.master,
                     *hyper, float(beta1), float(beta2), float(eps), bc1, bc2_sqrt,
                     HAS_SCALE=scale is not None, BLOCK=BLOCK, num_warps=8)
    optimizer.flat_adam_wrote = True  # Megatron's master-to-weight copy skips this step
    return True


def _off(optimizer, reason: str) -> None:
    """From now on torch's fused kernel: each parameter gets a step tensor of its own again (torch adds 1 to
    each), and the run's log says so."""
    shared = optimizer.flat_adam_step_t
    for space in optimizer.flat_adam:
        for main in space.mains:
            if space.exp_avg is None:
                optimizer.state[main].clear()  # no moments yet: torch makes its state afresh
            else:
                optimizer.state[main]["step"] = shared.clone()
    optimizer.flat_adam = None
    optimizer.flat_adam_off = reason
    _say(f"flat_adam off after {getattr(optimizer, 'flat_adam_step', None) or 0} flat steps: {reason} "
         "(torch's fused AdamW and Megatron's copy from now on)")


def after_init(megatron_optimizer) -> bool:
    """A Float16OptimizerWithFloat16Params just built: its masters and weights go flat where they can."""
    optimizer = getattr(megatron_optimizer, "optimizer", None)
    if not (_ACCEPTS and isinstance(optimizer, _ACCEPTS[0])) or getattr(megatron_optimizer, "is_stub_optimizer", False):
        return False
    if any(megatron_optimizer.fp32_from_fp32_groups):
        optimizer.flat_adam_off = "fp32 weights beside the bf16 ones"
        return False
    pairs = [(main, model) for models, mains in zip(megatron_optimizer.float16_groups,
                                                   megatron_optimizer.fp32_from_float16_groups)
             for model, main in zip(models, mains)]
    before = _allocated_gib()
    ok = adopt(optimizer, pairs)
    if ok:
        spaces = optimizer.flat_adam
        _say(f"flat_adam on: {sum(s.numel for s in spaces):,} parameters in {len(spaces)} flat buffer(s), "
             f"{sum(s.starts.numel() for s in spaces):,} chunks; GPU memory allocated {before:.2f} -> "
             f"{_allocated_gib():.2f} GiB")
    else:
        _say(f"flat_adam off: {optimizer.flat_adam_off} (torch's fused AdamW and Megatron's copy)")
    return ok


def _allocated_gib() -> float:
    return torch.cuda.memory_allocated() / 2 ** 30 if torch.cuda.is_available() else 0.0


def _say(line: str) -> None:
    """One line in the run's log (rank 0), so a record says whether the lever really ran."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"megalab: {line}", flush=True)


_ACCEPTS: list = []  # the optimizer class whose step calls step() above (fastpath's FusedAdamW), set by install


def install(optimizer_cls: type) -> bool:
    """Megatron's Float16OptimizerWithFloat16Params adopts flat buffers at its construction (when its
    torch optimizer is an `optimizer_cls`: megalab's FusedAdamW, whose step calls step() above) and skips
    its master-to-weight copy after a flat step. fastpath passes the class in, so that this module never
    imports fastpath (which imports this one)."""
    _ACCEPTS[:] = [optimizer_cls]
    from megatron.core.optimizer import optimizer as optmod

    cls = optmod.Float16OptimizerWithFloat16Params
    if getattr(cls, "_megalab_flat_adam", False):
        return True
    init, copy = cls.__init__, cls._copy_main_params_to_model_params

    def __init__(self, optimizer, *args, **kwargs):
        init(self, optimizer, *args, **kwargs)
        after_init(self)

    def _copy_main_params_to_model_params(self):
        if getattr(self.optimizer, "flat_adam_wrote", False):
            self.optimizer.flat_adam_wrote = False  # the flat step wrote every weight already
            return
        copy(self)

    cls.__init__ = __init__
    cls._copy_main_params_to_model_params = _copy_main_params_to_model_params
    cls._megalab_flat_adam = True
    return True
