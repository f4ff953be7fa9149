"""The MLP's bias and GeLU inside cuBLASLt's GEMM epilogues (the gelu_epilogue lever), through nvmath-python.

Why. Without TE, a GPT-2 MLP's GeLU costs two passes over the [tokens, 4 x hidden] activation each way. Forward,
fc1's GEMM writes the pre-activation and Megatron's compiled bias-GeLU reads it back to write the activation;
backward, fc2's input-gradient GEMM writes the activation's gradient and a second kernel (megalab's bias_gelu lever)
reads it with the saved pre-activation to write the pre-activation's gradient. cuBLASLt can do both in the GEMMs'
epilogues, while the tile is still in registers: GELU_AUX_BIAS adds fc1's bias and applies GeLU (the tanh
approximation, as Megatron's fused bias-GeLU), writing the activation and the pre-activation (the "aux"), and
DGELU multiplies fc2's input gradient by GeLU's derivative at that pre-activation. fc1's bias gradient is summed apart:
DGELU_BGRAD, which would sum it in the epilogue too, picked slower kernels (results/bench/gelu-epilogue-microbench.txt).

What this does. Megatron's MLP forward runs as one autograd function where the layer is a dense GeLU MLP with
biases on one tensor-parallel rank (the local spec's Column/RowParallelLinear): fc1 with the GELU_AUX_BIAS epilogue,
fc2 as Megatron's GEMM, and a backward that mirrors Megatron's linear layers (fp32 main_grad accumulation with
--gradient-accumulation-fusion, dummy weight gradients for its DDP hook), except that fc2's input-gradient GEMM
carries the DGELU epilogue. fc2's bias is returned unadded, for the bias-dropout-add, as Megatron's MLP does.
Anything else (gated units, no bias, experts, TP > 1, CPU tensors, no nvmath) runs Megatron's own forward.

cuBLASLt is column-major: each call computes a transpose. pre^T (4h x T) = W1 (4h x h) @ x^T (h x T), so the
bias runs along the result's rows, as cuBLASLt's epilogue wants, and the column-major result read as its
transpose is the row-major [T, 4h] activation, with no copy.

Plans (descriptors, the heuristic's algorithm, a workspace) are made once per shape, outside any CUDA graph
capture (Megatron's graphs capture after eager warm-up steps), then reused with new pointers. A plan may run on
another thread than the one that made it: autograd runs the backward, and with full recompute the forward again, on
a thread of its own, where cuda.core's per-thread device must first be made current (_make_current). The plumbing is
checked on the CPU with the two epilogue calls replaced by their torch equivalents: tests/test_gelu_epilogue.py.
"""
from __future__ import annotations

import logging
import threading

import torch
import torch.nn.functional as F

try:  # NVIDIA's Python interface to cuBLASLt (pip install nvmath-python): on GPU machines only
    from nvmath.linalg.advanced import Matmul, MatmulEpilog
    from cuda.core import Device  # nvmath's own device handle (cuda-core, one of its dependencies)
except Exception:  # pragma: no cover - no nvmath (CPU CI) or no CUDA driver: no lever
    Matmul = MatmulEpilog = Device = None

_PLANS: dict = {}  # (epilogue, shapes, strides, dtype, device) -> a planned nvmath Matmul
# nvmath logs each execute() at INFO to the root logger unless given its own, and Megatron sets the root logger to
# INFO: lines for every GEMM of every step no CUDA graph replays. Its own logger, at WARNING, keeps its warnings and
# drops the rest.
_LOG = logging.getLogger("megalab.nvmath")
_LOG.setLevel(logging.WARNING)


_THREAD = threading.local()  # .devices: the device indices cuda.core has made current on this thread


def _make_current(device: torch.device) -> None:
    """Make `device` current for cuda.core on the calling thread, once per thread. cuda.core's Device is a per-thread
    singleton that refuses work until set_current() ran on that thread; nvmath calls it only while planning, so a plan
    made on the main thread failed on autograd's thread when full recompute ran the forward there (row 300: "Device 0
    is not yet initialized"). Torch uses the same primary context, so this changes nothing for torch."""
    done = getattr(_THREAD, "devices", None)
    if done is None:
        done = _THREAD.devices = set()
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in done:
        Device(index).set_current()
        done.add(index)


def _run(epilog: str, a: torch.Tensor, b: torch.Tensor, inputs: dict):
    """a @ b with cuBLASLt's `epilog`, on the current stream; planned once per shape, operands released after."""
    _make_current(a.device)
    stream = torch.cuda.current_stream(a.device)
    key = (epilog, a.shape, a.stride(), b.shape, b.stride(), a.dtype, a.device)
    mm = _PLANS.get(key)
    if mm is None:
        mm = Matmul(a, b, options={"blocking": "auto", "logger": _LOG}, stream=stream)
        mm.plan(epilog=getattr(MatmulEpilog, epilog), epilog_inputs=inputs, stream=stream)
        _PLANS[key] = mm
    else:
        mm.reset_operands_unchecked(a=a, b=b, epilog_inputs=inputs)
    out = mm.execute(stream=stream)
    mm.release_operands()  # the plan must not keep the layer's activations alive
    return out


def fc1_gelu(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor):
    """(gelu(x @ w1^T + b1) as [T, 4h], the pre-activation in cuBLASLt's aux layout) for x [T, h]."""
    y_t, aux = _run("GELU_AUX_BIAS", w1, x.t(), {"bias": b1})
    return y_t.t(), aux["gelu_aux"]


def dgelu(g: torch.Tensor, w2: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """(g @ w2) * gelu'(pre) as [T, 4h], for fc2's output gradient g [T, h] and fc1_gelu's pre-activation."""
    return _run("DGELU", w2.t(), g.t(), {"gelu_aux": pre}).t()


def _wgrad(weight: torch.Tensor, inp: torch.Tensor, grad: torch.Tensor, fusion: bool):
    """The weight gradient as Megatron's linear layer returns it (tensor_parallel/layers.py): with
    --gradient-accumulation-fusion added into main_grad and a dummy for DDP's hook, else grad^T @ inp."""
    if not fusion:
        return grad.t().matmul(inp)
    from megatron.core.tensor_parallel import layers

    accum = layers.fused_weight_gradient_mlp_cuda
    if weight.main_grad.dtype == torch.float32:
        accum.wgrad_gemm_accum_fp32(inp, grad, weight.main_grad)
    else:
        accum.wgrad_gemm_accum_fp16(inp, grad, weight.main_grad)
    if not hasattr(weight, "grad_added_to_main_grad"):
        return None
    make = torch.zeros if getattr(weight, "zero_out_wgrad", False) else torch.empty
    weight.grad_added_to_main_grad = True
    return make(weight.main_grad.shape, dtype=inp.dtype, device=inp.device)


def _bias_grad(bias: torch.Tensor, dpre: torch.Tensor):
    """fc1's bias gradient: the pre-activation's gradient summed over the tokens, in fp32 straight into main_grad
    where megalab's kernels put it (param_grad.into_main_grad), else as Megatron's unfused path gives it."""
    from megalab.runtime import param_grad

    if not param_grad.into_main_grad(bias):
        return dpre.sum(0)
    bias.main_grad.add_(dpre.sum(0, dtype=torch.float32))
    bias.grad_added_to_main_grad = True  # Megatron's DDP hook skips its add (distributed_data_parallel.py)
    return torch.empty_like(bias)


class _GeLUMLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w1, b1, w2, fc1_fusion: bool, fc2_fusion: bool):
        x2 = x.reshape(-1, x.shape[-1])
        y, pre = fc1_gelu(x2, w1, b1)
        out = torch.matmul(y, w2.t())
        ctx.save_for_backward(x2, w1, pre, y, w2)
        ctx.b1, ctx.fusion, ctx.shape = b1, (fc1_fusion, fc2_fusion), x.shape
        return out.view(*x.shape[:-1], w2.shape[0])

    @staticmethod
    def backward(ctx, grad_out):
        x2, w1, pre, y, w2 = ctx.saved_tensors
        g = grad_out.reshape(-1, grad_out.shape[-1])
        g = g if g.is_contiguous() else g.contiguous()
        dpre = dgelu(g, w2, pre)
        dw2 = _wgrad(w2, y, g, ctx.fusion[1])
        db1 = _bias_grad(ctx.b1, dpre)
        dw1 = _wgrad(w1, x2, dpre, ctx.fusion[0])
        dx = dpre.matmul(w1)
        return dx.view(ctx.shape), dw1, db1, dw2, None, None


def _device_ok(x: torch.Tensor) -> bool:
    return Matmul is not None and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16)


def eligible(mlp, x: torch.Tensor, per_token_scale) -> bool:
    """A dense GeLU MLP with biases on one tensor-parallel rank, built from the local spec's linear layers, its
    widths multiples of 8. (Megatron's dense MLP ignores its other keyword arguments, the layer's padding_mask.)"""
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    c, fc1, fc2 = mlp.config, mlp.linear_fc1, mlp.linear_fc2
    return (per_token_scale is None and _device_ok(x) and x.is_contiguous()
            and type(fc1) is ColumnParallelLinear and type(fc2) is RowParallelLinear and not fc1.is_expert
            and fc1.weight.shape[0] % 8 == 0 and fc1.weight.shape[1] % 8 == 0  # cuBLASLt's 16-byte alignment
            and c.bias_activation_fusion and not c.use_te_activation_func and mlp.activation_func is F.gelu
            and not c.gated_linear_unit and c.add_bias_linear and fc1.skip_bias_add and fc2.skip_bias_add
            and fc1.bias is not None and c.tensor_model_parallel_size == 1 and not c.sequence_parallel
            and not getattr(c, "delay_wgrad_compute", False) and fc1.weight.dtype == x.dtype)


_MEGATRON_FORWARD = None
_SAID: set = set()  # which of on/off the log has said: a run's log shows whether its MLPs took the epilogues


def forward(self, hidden_states, per_token_scale=None, **kwargs):
    """Megatron's MLP.forward, with the epilogues where eligible."""
    ok = eligible(self, hidden_states, per_token_scale)
    if ok not in _SAID:
        _SAID.add(ok)
        print(f"megalab: gelu_epilogue {'on: cuBLASLt epilogues' if ok else 'off: Megatron forward'} for an MLP of "
              f"hidden {hidden_states.shape[-1]}", flush=True)
    if not ok:
        return _MEGATRON_FORWARD(self, hidden_states, per_token_scale, **kwargs)
    fc1, fc2 = self.linear_fc1, self.linear_fc2
    out = _GeLUMLP.apply(hidden_states, fc1.weight, fc1.bias, fc2.weight,
                         bool(fc1.gradient_accumulation_fusion), bool(fc2.gradient_accumulation_fusion))
    return out, fc2.bias


def install() -> bool:
    """Route Megatron's MLP.forward here (eligible layers only); False where nvmath is absent."""
    global _MEGATRON_FORWARD
    from megatron.core.transformer import mlp

    if Matmul is None or not torch.cuda.is_available():
        return False
    if mlp.MLP.forward is forward:
        return True
    _MEGATRON_FORWARD = mlp.MLP.forward
    mlp.MLP.forward = forward
    return True
