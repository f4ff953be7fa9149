"""Grouped-GEMM MoE experts without Transformer Engine: `GroupedMLP`, built on `torch._grouped_mm`.

Why. Without TE, Megatron's MoE experts are `SequentialMLP`: a Python loop that runs each local
expert's two linears on its slice of the tokens. With 64 small experts that is 128 small GEMMs
plus as many launches and splits per layer, which is why our olmoe-like rows trail the published
ones that use TE's grouped GEMM (`TEGroupedMLP`;
results/bench/README.md#moe-experts-without-te-sequentialmlp-vs-groupedmlp). PyTorch has its own grouped GEMM,
`torch._grouped_mm` (CUTLASS, bf16, Hopper from torch 2.8; `torch.nn.functional.grouped_mm` in
newer torch): one kernel multiplies every expert's tokens by that expert's weight.

What. `GroupedMLP` *is* a `SequentialMLP` (a subclass): the same constructor, the same per-expert
`local_experts.{i}.linear_fc1/linear_fc2` parameters with the same initialisation, tensor-parallel
attributes, state dict and distributed-checkpoint mapping, so parameter counts, checkpoints and
even the initial weights are those of a SequentialMLP run. Only `forward` differs: instead of the
loop it runs

    fc1:  grouped_mm(tokens, W1)        one GEMM over all local experts
    act:  the expert MLP's own activation (gated or not), times the router probs
    fc2:  grouped_mm(h, W2)

with exactly the elementwise steps of Megatron's `MLP.forward` in between, so it computes the same
function as SequentialMLP (tests/test_grouped_experts.py compares outputs and every gradient).

How it is switched on. megalab/runtime/spec.py builds MoE layers with these experts when the `grouped_gemm`
fast-path lever is in MEGALAB_FAST (the launcher adds it when the model preset asks for
`moe_grouped_gemm` and TE is absent; FAST=none or a FAST list without it gives SequentialMLP), or
when Megatron's own `--moe-grouped-gemm` is on with megalab's spec: see `wanted`.

Costs and limits, each handled where it arises below:
* `_grouped_mm` needs one [experts, out, in] tensor, but the weights stay per expert (that is what
  keeps the SequentialMLP layout). So each forward stacks them (a copy of the local expert weights,
  freed right after the GEMM) and the backward stacks them again instead of keeping the copy alive
  until then (which would cost one copy of the expert weights per layer in activation memory).
* Its backward is not usable everywhere (on CPU it fails with "Invalid strides/sizes"), so the
  GEMMs sit in `_GroupedLinear`, an autograd Function whose backward is grouped GEMMs too.
* Where `_grouped_mm` cannot run (float64, strides that are not 16-byte aligned, an old torch, a
  GPU it does not support) each GEMM falls back to a loop of per-expert matmuls: exact, slow. The
  first forward prints which kernel ran (`megalab: moe_experts_kernel=...`); a fallback on a GPU
  also warns.
* Expert tensor parallelism needs nothing special: with ETP > 1 each local linear already holds
  its moe_ffn_hidden / ETP slice (Megatron's token dispatcher gathers and reduce-scatters across
  the expert-TP group; the expert linears themselves communicate nothing), and the grouped GEMMs
  use those slices as they are. Expert parallelism: `num_local_experts` are this rank's experts.
* One local expert, fp8/fp4 (TE only) and GTP-wrapped weights go to SequentialMLP's forward.
"""
from __future__ import annotations

import itertools
import warnings
from functools import partial

import torch
import torch.nn.functional as F

from megalab.runtime import levers, moe_act, param_grad
from megatron.core.fusions.fused_bias_geglu import quick_gelu, weighted_bias_quick_geglu_impl
from megatron.core.fusions.fused_bias_swiglu import weighted_bias_swiglu_impl
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.mlp import MLPSubmodules
from megatron.core.transformer.moe.experts import SequentialMLP

__all__ = ["GroupedMLP", "experts_builder", "wanted", "LEVER"]

LEVER = levers.GROUPED_GEMM  # its name in MEGALAB_FAST / FAST= ("grouped_gemm")

_grouped_mm = getattr(torch, "_grouped_mm", None)
_CPU_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # what the CPU kernel accepts
_FAILED: set[tuple[str, torch.dtype]] = set()  # (device type, dtype) where _grouped_mm raised
_REPORTED = False
_OOM = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)


def _host_to(values: list[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small host list on `device`; to a GPU through pinned memory, so the copy is asynchronous
    (a copy from pageable memory would synchronise the stream)."""
    t = torch.tensor(values, dtype=dtype)
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t


def wanted(moe_grouped_gemm: bool = False) -> bool:
    """Whether megalab's spec builds MoE layers with GroupedMLP: the run has the lever (levers.applied), or
    Megatron's own --moe-grouped-gemm is set (which, with the local implementation, Megatron itself
    ignores: its local spec builds SequentialMLP whatever the flag says)."""
    return bool(moe_grouped_gemm) or levers.on(LEVER)


def experts_builder():
    """What Megatron's MoESubmodules.experts expects: a builder called as
    builder(num_local_experts, config, pg_collection=..., name=...). Same submodules as the local
    backend gives SequentialMLP (megatron.core.models.backends.LocalSpecProvider)."""
    return partial(GroupedMLP, submodules=MLPSubmodules(
        linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear, activation_func=None))


# ---- the grouped GEMMs: torch._grouped_mm where it can run, a per-expert loop elsewhere ----------
class _Groups:
    """The expert boundaries of the permuted tokens: offs (int32 cumulative ends, on the tokens'
    device, as _grouped_mm wants) and, when known without a device sync, the counts on the host.

    Megatron's alltoall and allgather dispatchers hand tokens_per_expert over on the CPU (they
    synchronised for it already); a device tensor is used as it is, and only the loop fallback
    then pays a sync to read it.
    """

    def __init__(self, tokens_per_expert: torch.Tensor, num_tokens: int, device: torch.device,
                 on_host: bool | None = None):
        self.num_tokens = num_tokens
        if tokens_per_expert.device.type == "cpu" if on_host is None else on_host:
            self.counts = [int(c) for c in tokens_per_expert.tolist()]
            if sum(self.counts) != num_tokens:  # torch.split in SequentialMLP would fail as well
                raise ValueError(f"tokens_per_expert sums to {sum(self.counts)}, but {num_tokens} "
                                 "tokens were dispatched to the local experts")
            self.offs = _host_to(list(itertools.accumulate(self.counts)), torch.int32, device)
            self.device_counts = None
        else:
            self.counts = None
            self.device_counts = tokens_per_expert
            self.offs = tokens_per_expert.cumsum(0).to(torch.int32)
        self.used: set[str] = set()  # which kernels ran: "torch._grouped_mm" and/or "loop"
        self._expert_index: torch.Tensor | None = None

    def host_counts(self) -> list[int]:
        if self.counts is None:
            self.counts = [int(c) for c in self.device_counts.tolist()]  # a device sync
        return self.counts

    def slices(self):
        start = 0
        for c in self.host_counts():
            yield slice(start, start + c)
            start += c

    def expert_of_each_token(self) -> torch.Tensor:
        """[tokens] local expert index, for per-expert biases; built once (fc1's and fc2's biases
        both need it)."""
        if self._expert_index is None:
            counts = (self.device_counts if self.device_counts is not None
                      else _host_to(self.counts, torch.int64, self.offs.device))
            self._expert_index = torch.repeat_interleave(torch.arange(len(self.offs), device=self.offs.device),
                                                         counts, output_size=self.num_tokens)
        return self._expert_index


def _aligned(t: torch.Tensor) -> bool:
    """torch._grouped_mm's layout rule: row- or column-major in the last two dims, with the other
    stride a multiple of 16 bytes (its CPU kernel checks this too), and a 16-byte aligned start."""
    per = 16 // t.element_size()
    s0, s1 = t.stride()[-2:]
    return ((s1 == 1 and s0 % per == 0) or (s0 == 1 and s1 % per == 0)) and t.data_ptr() % 16 == 0


def _use_grouped_mm(kernel: str, a: torch.Tensor, b: torch.Tensor) -> bool:
    if kernel == "loop":
        return False
    ok = (_grouped_mm is not None and a.dtype == b.dtype and _aligned(a) and _aligned(b)
          and (a.device.type, a.dtype) not in _FAILED
          and (a.device.type == "cuda" or (a.device.type == "cpu" and a.dtype in _CPU_DTYPES)))
    if kernel == "grouped_mm" and not ok:
        raise RuntimeError(f"torch._grouped_mm cannot run on {a.dtype} {a.device.type} tensors of "
                           f"strides {a.stride()} / {b.stride()} (kernel='grouped_mm' was forced)")
    return ok


def _try_grouped_mm(kernel, a, b, groups):
    """torch._grouped_mm(a, b, offs=groups.offs), or None where this torch/device/dtype refuses it (then
    the caller loops; the refusal is remembered, so it is tried once per device type and dtype)."""
    if not _use_grouped_mm(kernel, a, b):
        return None
    try:
        out = _grouped_mm(a, b, offs=groups.offs)
        groups.used.add("torch._grouped_mm")
        return out
    except _OOM:
        raise
    except RuntimeError as e:  # e.g. a GPU generation or dtype this torch's kernel lacks
        if kernel == "grouped_mm":
            raise
        _FAILED.add((a.device.type, a.dtype))
        if a.device.type != "cpu":
            warnings.warn(f"megalab GroupedMLP: torch._grouped_mm refused {a.dtype} on {a.device.type} "
                          f"({str(e).splitlines()[0]}); the experts loop over per-expert matmuls instead")
        return None


def _fc(x, w, groups, kernel):
    """y[tokens, out] = x_e @ W_e^T for each expert e's tokens. w: [experts, out, in]."""
    y = _try_grouped_mm(kernel, x, w.transpose(1, 2), groups)
    if y is None:
        groups.used.add("loop")
        y = x.new_empty(x.shape[0], w.shape[1])
        for e, s in enumerate(groups.slices()):
            torch.mm(x[s], w[e].t(), out=y[s])
    return y


def _dgrad(dy, w, groups, kernel):
    """dx[tokens, in] = dy_e @ W_e."""
    dx = _try_grouped_mm(kernel, dy, w, groups)
    if dx is None:
        groups.used.add("loop")
        dx = dy.new_empty(dy.shape[0], w.shape[2])
        for e, s in enumerate(groups.slices()):
            torch.mm(dy[s], w[e], out=dx[s])
    return dx


def _wgrad(dy, x, groups, kernel, into=None, fresh=False):
    """dW[experts, out, in] = dy_e^T @ x_e: _grouped_mm's 2D x 2D form, the groups cutting the
    token (contraction) dimension. dy.t() is a column-major view, so no copy and no alignment
    requirement on the token count.

    into: a main_grad [experts, out, in] (fp32, Megatron's DDP) to add the gradient into instead of returning
    it (None returned), in one pass that also masks out the empty experts (param_grad.into_stacked), where DDP's
    hook would add it after a pass of its own; fresh: main_grad holds nothing yet, so the pass writes, not adds."""
    dw = _try_grouped_mm(kernel, dy.t(), x, groups)
    if dw is None:
        groups.used.add("loop")
        dw = dy.new_empty(len(groups.offs), dy.shape[1], x.shape[1])
        for e, s in enumerate(groups.slices()):
            torch.mm(dy[s].t(), x[s], out=dw[e])  # an expert without tokens gets zeros
    # An expert without tokens must get a zero gradient; do not rely on the kernel writing its
    # group (pytorch/pytorch#172439: non-zero gradients for empty groups on Blackwell).
    elif groups.counts is not None:
        for e, c in enumerate(groups.counts):
            if c == 0:
                dw[e].zero_()
    elif into is not None and param_grad.into_stacked(into, dw, groups.device_counts, fresh):
        return None
    else:  # counts on the device: a mask, no host sync
        keep = (groups.device_counts != 0).view(-1, 1, 1)
        if into is not None:
            if fresh:
                torch.mul(dw, keep.to(into.dtype), out=into)
            else:
                into.addcmul_(dw, keep.to(into.dtype))
            return None
        return dw.mul_(keep.to(dw.dtype))
    if into is not None:
        if not param_grad.into_stacked(into, dw, None, fresh):
            if fresh:
                into.copy_(dw)
            else:
                into.add_(dw)
        return None
    return dw


class _GroupedLinear(torch.autograd.Function):
    """y = per-expert x_e @ W_e^T for a list of per-expert weights [out, in], as one grouped GEMM.

    The weights come in as separate tensors (the per-expert Parameters) and are stacked inside, so
    autograd saves the Parameters themselves (no extra memory) rather than the stacked copy; the
    backward stacks them again for the input gradient and returns each expert's weight gradient
    as its slice of one grouped wgrad GEMM.
    """

    @staticmethod
    def forward(ctx, x, groups, kernel, *weights):
        ctx.groups, ctx.kernel = groups, kernel
        ctx.save_for_backward(x, *weights)
        w = _stacked(weights)
        if x.shape[0] == 0:  # no tokens reached this rank's experts
            return x.new_empty(0, w.shape[1])
        return _fc(x.contiguous(), w, groups, kernel)

    @staticmethod
    def backward(ctx, dy):
        x, *weights = ctx.saved_tensors
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[3:]
        dx, dws = None, [None] * len(weights)
        if x.shape[0] == 0:
            dx = torch.zeros_like(x) if need_x else None
            dws = [torch.zeros_like(w) if n else None for w, n in zip(weights, need_w)]
            return (dx, None, None, *dws)
        dy = dy.contiguous()
        if need_x:
            dx = _dgrad(dy, _stacked(weights), ctx.groups, ctx.kernel)
        if any(need_w):
            stacked = len(weights) == 1 and weights[0].dim() == 3
            if stacked and _into_main_grad(weights[0]):
                dws = [_added_to_main_grad(weights[0], dy, x.contiguous(), ctx.groups, ctx.kernel)]
            else:
                dw = _wgrad(dy, x.contiguous(), ctx.groups, ctx.kernel)
                dws = [dw] if stacked else [g if n else None for g, n in zip(dw.unbind(0), need_w)]
        return (dx, None, None, *dws)


def _into_main_grad(w) -> bool:
    """Megatron's DDP holds this weight's fp32 gradient (main_grad) and reads grad_added_to_main_grad."""
    return getattr(w, "main_grad", None) is not None and hasattr(w, "grad_added_to_main_grad")


def _added_to_main_grad(w, dy, x, groups, kernel):
    """The stacked weight's gradient added into its main_grad here, as Megatron's linear layers do with
    --gradient-accumulation-fusion: DDP's hook then sees grad_added_to_main_grad and adds nothing; the returned
    tensor is Megatron's placeholder (uninitialised; zeros where the parameter asks for zero_out_wgrad)."""
    _wgrad(dy, x, groups, kernel, into=w.main_grad, fresh=not w.grad_added_to_main_grad)
    w.grad_added_to_main_grad = True
    make = torch.zeros if getattr(w, "zero_out_wgrad", False) else torch.empty
    return make(w.shape, dtype=w.dtype, device=w.device)


def _stacked(weights) -> torch.Tensor:
    """[experts, out, in]: the one stacked weight of expert_stack as it is, per-expert weights stacked (a copy)."""
    return weights[0] if len(weights) == 1 and weights[0].dim() == 3 else torch.stack(weights)


class _Stacked(torch.nn.Module):
    """One linear's weights (and biases) of every local expert, stacked: weight [experts, out, in], bias
    [experts, out]. Never called: GroupedMLP reads its tensors (its DDP pre-hooks are fired by GroupedMLP)."""

    def __init__(self, linears):
        super().__init__()
        self.weight = _stack_parameters([lin.weight for lin in linears])
        self.bias = _stack_parameters([lin.bias for lin in linears]) if linears[0].bias is not None else None


def _stack_parameters(params) -> torch.nn.Parameter:
    """The per-expert parameters as one [experts, ...] Parameter with their attributes (tensor-parallel axis one
    further along); the per-expert ones are dropped by the caller."""
    stacked = torch.nn.Parameter(torch.stack([p.detach() for p in params]), requires_grad=params[0].requires_grad)
    for name, value in vars(params[0]).items():
        if not name.startswith("_") and name not in ("main_grad", "grad_added_to_main_grad"):
            setattr(stacked, name, value + 1 if name == "partition_dim" else value)
    return stacked


class GroupedMLP(SequentialMLP):
    """SequentialMLP's experts and parameters, computed with grouped GEMMs (see the module doc).

    With the expert_stack lever each linear's expert weights are one stacked Parameter (`linear_fc1.weight`
    [experts, out, in]), initialised exactly as SequentialMLP's and presented under SequentialMLP's per-expert
    keys in every state dict and checkpoint; without it the weights stay per expert and are stacked per call.

    forward(permuted_local_hidden_states [tokens, hidden], tokens_per_expert [local experts],
    permuted_probs [tokens]) -> (output [tokens, hidden], None), as MoELayer calls every experts
    module (megatron.core.transformer.moe.moe_layer.ExpertsInterface).
    """

    kernel = "auto"  # "auto" | "grouped_mm" (must run, tests) | "loop" (per-expert matmuls)

    def __init__(self, num_local_experts, config, submodules, pg_collection=None, name=None):
        super().__init__(num_local_experts, config, submodules, pg_collection=pg_collection, name=name)
        self.stacked = levers.on(levers.EXPERT_STACK) and not self._sequential()
        if self.stacked:
            experts = list(self.local_experts)
            self.linear_fc1 = _Stacked([e.linear_fc1 for e in experts])
            self.linear_fc2 = _Stacked([e.linear_fc2 for e in experts])
            for e in experts:
                for lin in (e.linear_fc1, e.linear_fc2):
                    lin.weight = lin.bias = None  # now views of the stacked tensors, made where asked for
            self._register_state_dict_hook(_per_expert_keys)
            self._register_load_state_dict_pre_hook(_stacked_keys, with_module=True)

    def _sequential(self) -> bool:
        """One local expert is one GEMM already; fp8/fp4 padding and GTP-wrapped weights are SequentialMLP's."""
        return (self.num_local_experts == 1 or self.config.fp8 or self.config.fp4
                or any(getattr(lin, "gtp_remat_size", 1) > 1
                       for e in self.local_experts for lin in (e.linear_fc1, e.linear_fc2)))

    def forward(self, permuted_local_hidden_states, tokens_per_expert, permuted_probs):
        if not self.stacked and self._sequential():
            return super().forward(permuted_local_hidden_states, tokens_per_expert, permuted_probs)
        experts = list(self.local_experts)
        if self.stacked:
            fc1, fc2 = [self.linear_fc1], [self.linear_fc2]
        else:
            fc1, fc2 = [e.linear_fc1 for e in experts], [e.linear_fc2 for e in experts]
        # The linears are not called, so fire their forward pre-hooks ourselves: Megatron's DDP waits there for
        # each module's parameter all-gather (--overlap-param-gather with ZeRO-2).
        for m in (*fc1, *fc2) if self.stacked else (m for e in experts for m in e.modules()):
            _run_forward_pre_hooks(m)

        x, probs = permuted_local_hidden_states, permuted_probs
        if self.config.moe_apply_probs_on_input:  # as SequentialMLP.forward does
            assert self.config.moe_router_topk == 1, \
                "`moe_apply_probs_on_input` only works with `moe_router_topk`=1."
            x = (probs.unsqueeze(-1) * x).to(x.dtype)
            probs = torch.ones_like(probs)

        groups = _Groups(tokens_per_expert, x.shape[0], x.device)
        h = _GroupedLinear.apply(x, groups, self.kernel, *(lin.weight for lin in fc1))
        bias1 = self._per_token_bias(fc1, groups)
        h = self._activation(experts[0], h, bias1, probs)
        out = _GroupedLinear.apply(h, groups, self.kernel, *(lin.weight for lin in fc2))
        bias2 = self._per_token_bias(fc2, groups)
        if bias2 is not None:
            # MLP.forward of an expert: output += output_bias * per_token_scale (in place, so in
            # the output's dtype), since the bias is not left to the bias-dropout-add.
            out += bias2 * probs.unsqueeze(-1)
        self.last_kernels = groups.used  # filled in further by the backward
        self._report(groups)
        return out, None

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        """SequentialMLP's checkpoint, per expert, whose tensors are views of the stacked ones (so a load writes
        into them): a checkpoint of either layout loads into the other."""
        if not self.stacked:
            return super().sharded_state_dict(prefix, sharded_offsets, metadata)
        with _per_expert_views(self):
            return super().sharded_state_dict(prefix, sharded_offsets, metadata)

    @staticmethod
    def _per_token_bias(linears, groups):
        """Each token's expert's bias [tokens, out], or None without biases (--disable-bias-linear)."""
        if linears[0].bias is None:
            return None
        bias = linears[0].bias if len(linears) == 1 and linears[0].bias.dim() == 2 else torch.stack(
            [lin.bias for lin in linears])
        return bias[groups.expert_of_each_token()]

    def _activation(self, expert, h, bias, probs):
        """Megatron's MLP.forward between its two linears, with per_token_scale = the router probs.

        Mirrored branch by branch (megatron/core/transformer/mlp.py, 0.19.2) so the result is
        SequentialMLP's; `bias` is per token here (each token's expert's fc1 bias).
        """
        cfg = self.config
        act = expert.activation_func
        scale = probs.unsqueeze(-1)
        if cfg.use_te_activation_func:
            if bias is not None:
                h = h + bias
            h = act(h)
            return (h * scale).to(h.dtype)
        if cfg.bias_activation_fusion:
            if act == F.silu and cfg.gated_linear_unit:
                return weighted_bias_swiglu_impl(h, bias, scale, cfg.activation_func_fp8_input_store)
            if act == quick_gelu and cfg.gated_linear_unit:
                return weighted_bias_quick_geglu_impl(
                    h, bias, scale, cfg.activation_func_fp8_input_store, cfg.glu_linear_offset,
                    cfg.activation_func_clamp_value)
            raise ValueError("Only support fusion of swiglu and quick_gelu with per_token_scale in MLP.")
        if bias is not None:
            h = h + bias
        if (act is F.gelu and not cfg.gated_linear_unit and levers.on(moe_act.LEVER)
                and moe_act.eligible(h, probs)):
            return moe_act.weighted_gelu(h, probs)  # one kernel each way instead of three passes
        if cfg.gated_linear_unit:
            x_glu, x_linear = torch.chunk(h, 2, dim=-1)
            if (val := cfg.activation_func_clamp_value) is not None:
                x_glu = x_glu.clamp(min=None, max=val)
                x_linear = x_linear.clamp(min=-val, max=val)
            h = cfg.activation_func(x_glu) * (x_linear + cfg.glu_linear_offset)
        else:
            h = act(h)
        return (h * scale).to(h.dtype)

    def _report(self, groups):
        """Once per process, on the first rank: which kernel the experts' forward GEMMs ran, on which layout."""
        global _REPORTED
        if _REPORTED or not groups.used:
            return
        _REPORTED = True
        if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
            print(f"megalab: moe_experts_kernel={'+'.join(sorted(groups.used))} "
                  f"expert_weights={'stacked' if self.stacked else 'per-expert'}", flush=True)


_STACKED_NAMES = ("linear_fc1.weight", "linear_fc1.bias", "linear_fc2.weight", "linear_fc2.bias")


def _per_expert_keys(module, state_dict, prefix, local_metadata):
    """state_dict hook: the stacked tensors under SequentialMLP's keys (local_experts.<i>.linear_fc1.weight ...)."""
    for name in _STACKED_NAMES:
        stacked = state_dict.pop(prefix + name, None)
        if stacked is not None:
            for i, t in enumerate(stacked.unbind(0)):
                state_dict[f"{prefix}local_experts.{i}.{name}"] = t


def _stacked_keys(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
    """load_state_dict pre-hook: SequentialMLP's per-expert keys stacked into this module's tensors."""
    for name in _STACKED_NAMES:
        keys = [f"{prefix}local_experts.{i}.{name}" for i in range(module.num_local_experts)]
        if all(k in state_dict for k in keys):
            state_dict[prefix + name] = torch.stack([state_dict.pop(k) for k in keys])


class _per_expert_views:
    """Within: each expert linear's weight/bias is a Parameter sharing the stacked tensor's memory (SequentialMLP's
    sharded_state_dict reads them there); after: gone again."""

    def __init__(self, module: GroupedMLP):
        self.module = module

    def __enter__(self):
        for stack_name in ("linear_fc1", "linear_fc2"):
            stacked = getattr(self.module, stack_name)
            for i, e in enumerate(self.module.local_experts):
                lin = getattr(e, stack_name)
                for attr in ("weight", "bias"):
                    t = getattr(stacked, attr)
                    if t is not None:
                        view = torch.nn.Parameter(t.detach()[i], requires_grad=t.requires_grad)
                        for k, v in vars(t).items():
                            if not k.startswith("_") and k not in ("main_grad", "grad_added_to_main_grad"):
                                setattr(view, k, v - 1 if k == "partition_dim" else v)
                        setattr(lin, attr, view)

    def __exit__(self, *exc):
        for e in self.module.local_experts:
            for lin in (e.linear_fc1, e.linear_fc2):
                lin.weight = lin.bias = None


def _run_forward_pre_hooks(module: torch.nn.Module) -> None:
    """What module(...) would run before its forward: its own forward pre-hooks (no inputs)."""
    for hook_id, hook in list(module._forward_pre_hooks.items()):
        if hook_id in module._forward_pre_hooks_with_kwargs:
            hook(module, (), {})
        else:
            hook(module, ())
