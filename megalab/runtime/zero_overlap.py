"""The grad buffer's zeroing on a side stream, beside the forward (lever `zero_overlap`).

Why. Every step Megatron's DDP zeroes its fp32 grad buffer (`_ParamAndGradBuffer.reset`: `grad_data.zero_()`)
before the forward, on the compute stream: for GPT-2 XL's 1.56e9 parameters that is 6.2 GB written, about 1.9 ms a
step on an H100 with nothing else running (results/bench/runs/20261127_020054___profile-111-gpt2xl-dp1-fit-80GB,
FillFunctor<float>). Nothing reads or writes a main gradient until the first backward step, so the memset can run
beside the forward's GEMMs instead of ahead of them.

What this does. `reset` queues the memsets on a side stream, after everything already queued on the compute stream
(the optimizer that read these gradients), and records an event there. Megatron's `backward_step` (the one function
every schedule calls before any gradient is made) first makes the compute stream wait for that event. Inside
Megatron's full-iteration CUDA graph the wait is captured as an event-wait node (an *external* event), so every
replay waits for the memsets the host queued just before it; outside a graph it is a plain stream wait, a no-op
once the memsets are done (grad accumulation's later micro-batches).

Scope. A buffer on the CPU, or a reset called while a stream is being captured, goes to Megatron's reset unchanged.
The grad buffer is never freed, so its use on the side stream needs no `record_stream`.
"""
from __future__ import annotations

import torch

_STREAM: "torch.cuda.Stream | None" = None
_DONE: "torch.cuda.Event | None" = None  # external: a wait on it inside a graph capture becomes an event-wait node
_MEGATRON = {}  # Megatron's reset and backward_step, kept by install()


def reset(self) -> None:
    """_ParamAndGradBuffer.reset (same effect): its memsets queued on the side stream."""
    global _STREAM, _DONE
    if not self.grad_data.is_cuda or torch.cuda.is_current_stream_capturing():
        return _MEGATRON["reset"](self)
    if _STREAM is None:
        _STREAM = torch.cuda.Stream(device=self.grad_data.device)
        _DONE = torch.cuda.Event(external=True)
    _STREAM.wait_stream(torch.cuda.current_stream())  # after the optimizer step that read these gradients
    with torch.cuda.stream(_STREAM):
        self.grad_data.zero_()
        for grad in self.extra_main_grads:
            grad.zero_()
    _DONE.record(_STREAM)


def backward_step(*args, **kwargs):
    """Megatron's schedules.backward_step, once the zeroing queued by `reset` is done."""
    if _DONE is not None:
        torch.cuda.current_stream().wait_event(_DONE)
    return _MEGATRON["backward_step"](*args, **kwargs)


def install() -> bool:
    """Patch Megatron's grad-buffer reset and its schedules' backward step (once; later calls are no-ops)."""
    from megatron.core.distributed import param_and_grad_buffer as pgb
    from megatron.core.pipeline_parallel import schedules

    if pgb._ParamAndGradBuffer.reset is not reset:
        _MEGATRON["reset"] = pgb._ParamAndGradBuffer.reset
        pgb._ParamAndGradBuffer.reset = reset
    if schedules.backward_step is not backward_step:
        _MEGATRON["backward_step"] = schedules.backward_step
        schedules.backward_step = backward_step
    return True
