"""zero_overlap (megalab/runtime/zero_overlap.py): Megatron's grad-buffer reset and backward step, patched so the
zeroing can run beside the forward. On CPU (no streams) both go to Megatron's own, with the same effect; the
overlap itself is measured on the GPU (results/bench, "Levers tried against the default")."""
import types

import torch

from megalab._compat import ensure_typing_override
from megalab.runtime import fastpath, zero_overlap
from tests.conftest import keep_megatrons_zeroing


def _keep_megatrons(monkeypatch):
    ensure_typing_override()
    monkeypatch.setattr(zero_overlap, "_MEGATRON", {})
    return keep_megatrons_zeroing(monkeypatch)


def test_install_patches_reset_and_backward_step_once(monkeypatch):
    buffer, schedules = _keep_megatrons(monkeypatch)
    megatrons_reset, megatrons_backward = buffer.reset, schedules.backward_step
    assert fastpath.apply(["zero_overlap"]) == ["zero_overlap"]
    assert zero_overlap.install()  # a second install keeps Megatron's originals, not its own patches
    assert buffer.reset is zero_overlap.reset and schedules.backward_step is zero_overlap.backward_step
    assert zero_overlap._MEGATRON == {"reset": megatrons_reset, "backward_step": megatrons_backward}


def test_a_cpu_buffer_is_zeroed_by_megatrons_reset(monkeypatch):
    buffer, _ = _keep_megatrons(monkeypatch)
    zero_overlap.install()
    fake = types.SimpleNamespace(grad_data=torch.randn(64), extra_main_grads=[torch.randn(3, 4), torch.randn(5)])
    buffer.reset(fake)
    assert not fake.grad_data.any() and not any(g.any() for g in fake.extra_main_grads)
    assert zero_overlap._STREAM is None  # nothing queued on a side stream, so the backward step waits for nothing


def test_backward_step_is_megatrons_with_its_arguments(monkeypatch):
    _, schedules = _keep_megatrons(monkeypatch)
    calls = []
    monkeypatch.setattr(schedules, "backward_step", lambda *a, **k: calls.append((a, k)) or "grad")
    zero_overlap.install()
    assert schedules.backward_step("in", "out", None, config="cfg") == "grad"
    assert calls == [(("in", "out", None), {"config": "cfg"})]
