"""gelu_epilogue (megalab/runtime/gelu_epilogue.py): Megatron's MLP forward as one autograd function whose fc1 GEMM
adds the bias and applies GeLU in cuBLASLt's epilogue, and whose fc2 input-gradient GEMM multiplies by GeLU's
derivative in its own. CPU only: nvmath-python and CUDA are absent, so the two epilogue calls are replaced by torch
equivalents of cuBLASLt's math (the tanh approximation, the pre-activation aux in cuBLASLt's column-major layout),
and everything around them runs as it does on the GPU: the eligibility check, the routing of Megatron's
MLP.forward, the backward's weight gradients (into fp32 main_grad under --gradient-accumulation-fusion, through
megalab's stand-in for apex's extension), fc1's bias gradient, and the fallback to Megatron's forward.

What is checked, and why:
  - a small GPT with megalab's layer spec computes the same loss, logits and gradients with the lever as without,
    and every layer really took the epilogues (a call count: a layer that silently falls back to Megatron's
    forward would pass the numbers and lose the speed, as an unexpected keyword argument once made every layer do);
  - under gradient-accumulation fusion the weight and bias gradients land in main_grad, autograd gets dummies and
    Megatron's DDP hook is told (grad_added_to_main_grad), against autograd of the plain formula in float64;
  - an ineligible MLP runs Megatron's own forward, bit for bit;
  - the one log line a run shows, once;
  - without nvmath (this machine) nothing is installed.
Every patch goes through pytest's monkeypatch, so Megatron's MLP.forward and the lever's globals are restored after
each test.
"""
import pytest

from megalab._compat import ensure_typing_override

ensure_typing_override()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from megalab.runtime import fastpath, gelu_epilogue as GE  # noqa: E402
from megalab.runtime.spec import megalab_layer_spec  # noqa: E402
from tests.conftest import keep_megatrons_wgrad_lookup  # noqa: E402
from megatron.core.fusions import fused_bias_geglu, fused_bias_gelu  # noqa: E402
from megatron.core.models.gpt.gpt_model import GPTModel  # noqa: E402
from megatron.core.transformer import mlp as megatron_mlp  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

# float32 against float32 (or float64): the lever and Megatron do the same GEMMs and the same GeLU formula in a
# different order of operations (one autograd node instead of three), so they differ by a few ulps; a wrong bias,
# derivative or transpose shows at 1e-2 or more. As tests/test_spec.py's.
ATOL32, RTOL32 = 1e-5, 1e-4

H, FFN, VOCAB, SEQ, BATCH = 32, 128, 64, 16, 2  # widths multiples of 8: cuBLASLt's alignment, as eligible() asks


# ---------------------------------------------------------------------------- cuBLASLt's math, in torch

def _gelu_tanh(x):
    """cuBLASLt's GELU epilogue and Megatron's fused bias-GeLU: the tanh approximation."""
    return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))


def _gelu_tanh_grad(x):
    """Its derivative, as cuBLASLt's DGELU epilogue (and Megatron's bias_gelu_back) computes it."""
    t = torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x))
    return 0.5 * x * ((1 - t * t) * (0.79788456 + 0.1070322243 * x * x)) + 0.5 * (1 + t)


class _Epilogues:
    """Torch stand-ins for gelu_epilogue.fc1_gelu and gelu_epilogue.dgelu, counting their calls. The aux goes out
    as cuBLASLt lays it out (pre^T, [4h, T], column-major) and is read back the same way, so that a caller which
    hands dgelu anything else (the activation, the row-major pre-activation) fails a shape check or the numbers."""

    def __init__(self):
        self.fc1_calls = self.dgelu_calls = 0

    def fc1_gelu(self, x, w1, b1):
        self.fc1_calls += 1
        assert x.dim() == 2 and x.shape[1] == w1.shape[1] and b1.shape == (w1.shape[0],)
        pre = torch.addmm(b1, x, w1.t())
        return _gelu_tanh(pre), pre.t()

    def dgelu(self, g, w2, aux):
        self.dgelu_calls += 1
        assert aux.shape == (w2.shape[1], g.shape[0]), f"aux {tuple(aux.shape)}: not cuBLASLt's [4h, T]"
        return g.matmul(w2) * _gelu_tanh_grad(aux.t())


@pytest.fixture
def epilogues(monkeypatch):
    """The lever as on a GPU with nvmath, but on CPU float32: the epilogues faked, the device check widened, and
    MLP.forward and the lever's globals restored after the test (install() patches Megatron's class)."""
    fake = _Epilogues()
    monkeypatch.setattr(GE, "fc1_gelu", fake.fc1_gelu)
    monkeypatch.setattr(GE, "dgelu", fake.dgelu)
    monkeypatch.setattr(GE, "_device_ok", lambda x: x.dtype in (torch.float32, torch.float64))
    monkeypatch.setattr(GE, "Matmul", object())  # not None: install() takes nvmath to be there
    monkeypatch.setattr(megatron_mlp.MLP, "forward", megatron_mlp.MLP.forward)
    monkeypatch.setattr(GE, "_MEGATRON_FORWARD", None)
    monkeypatch.setattr(GE, "_SAID", set())
    return fake


def _install():
    """GE.install() as on a GPU host: CUDA reads as there only for the call (Megatron's layers must not think so)."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(torch.cuda, "is_available", lambda: True)
        return GE.install()


# ---------------------------------------------------------------------------- Megatron on CPU

@pytest.fixture
def megatron_on_cpu(megatron_on_cpu, monkeypatch):
    """conftest's Megatron on CPU, its compiled fusions run uncompiled (torch.compile on CPU would cost a C++ build per
    test): the same functions, Megatron's own code."""
    for mod in (fused_bias_gelu, fused_bias_geglu):
        for name, fn in list(vars(mod).items()):
            if callable(fn) and hasattr(fn, "__wrapped__") and getattr(fn, "__module__", "") == mod.__name__:
                monkeypatch.setattr(mod, name, fn.__wrapped__)


def _config(**overrides) -> TransformerConfig:
    kw = dict(num_layers=2, hidden_size=H, ffn_hidden_size=FFN, num_attention_heads=4, use_cpu_initialization=True,
              hidden_dropout=0.0, attention_dropout=0.0, masked_softmax_fusion=False,
              gradient_accumulation_fusion=False, persist_layer_norm=False, bias_dropout_fusion=False,
              bias_activation_fusion=True, activation_func=F.gelu)
    kw.update(overrides)
    return TransformerConfig(**kw)


def _gpt(cfg, seed=0):
    torch.manual_seed(seed)
    model = GPTModel(config=cfg, transformer_layer_spec=megalab_layer_spec(cfg), vocab_size=VOCAB,
                     max_sequence_length=SEQ)
    with torch.no_grad():  # Megatron initialises biases to zero: off their init, so a dropped bias cannot hide
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def _batch():
    g = torch.Generator().manual_seed(7)
    return (torch.randint(0, VOCAB, (BATCH, SEQ), generator=g), torch.arange(SEQ).expand(BATCH, SEQ),
            torch.randint(0, VOCAB, (BATCH, SEQ), generator=g))


def _run(model):
    """Logits, mean loss and every parameter's gradient on one fixed batch."""
    ids, pos, labels = _batch()
    model.zero_grad(set_to_none=True)
    logits = model(ids, pos, None)
    loss = model(ids, pos, None, labels=labels).float().mean()
    loss.backward()
    return logits.detach(), loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def _assert_same(got, want, atol=ATOL32, rtol=RTOL32):
    (l1, loss1, g1), (l2, loss2, g2) = got, want
    torch.testing.assert_close(l1, l2, atol=atol, rtol=rtol)
    torch.testing.assert_close(loss1, loss2, atol=atol, rtol=rtol)
    assert g1.keys() == g2.keys()
    for n in g1:
        assert g1[n] is not None and g2[n] is not None, f"{n}: no gradient"
        torch.testing.assert_close(g1[n], g2[n], atol=atol, rtol=rtol, msg=lambda m, n=n: f"{n}: {m}")


# ---------------------------------------------------------------------------- a GPT, with and without the lever

def test_gpt_with_the_epilogues_is_megatrons_gpt(megatron_on_cpu, epilogues):
    model = _gpt(_config())
    megatrons = _run(model)
    assert epilogues.fc1_calls == epilogues.dgelu_calls == 0

    assert _install() is True
    assert megatron_mlp.MLP.forward is GE.forward
    ours = _run(model)  # the same model, so the same weights: only MLP.forward differs
    _assert_same(ours, megatrons)
    # Each layer took the epilogues: once per layer per forward (two forwards: logits, loss), once per layer in the
    # one backward. A layer falling back to Megatron's forward would match the numbers and miss these.
    layers = model.config.num_layers
    assert epilogues.fc1_calls == 2 * layers
    assert epilogues.dgelu_calls == layers


def test_the_gpt_check_can_fail(megatron_on_cpu, epilogues, monkeypatch):
    """A derivative taken at the activation instead of the pre-activation (dgelu handed y) must fail the match."""
    model = _gpt(_config())
    megatrons = _run(model)
    assert _install()
    monkeypatch.setattr(GE, "dgelu", lambda g, w2, aux: g.matmul(w2) * _gelu_tanh_grad(_gelu_tanh(aux.t())))
    with pytest.raises(AssertionError):
        _assert_same(_run(model), megatrons)


# ---------------------------------------------------------------------------- gradient accumulation fusion

def _with_wgrad_stand_in(monkeypatch):
    """install_wgrad_fusion's stand-in put in, as without apex, and Megatron's lookup restored after the test."""
    layers = keep_megatrons_wgrad_lookup(monkeypatch)
    monkeypatch.setattr(layers, "_grad_accum_fusion_available", False)  # as without apex: the stand-in goes in
    assert fastpath.install_wgrad_fusion() is True


def _leaves(seed, dtype=torch.float32, t=24):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t // 2, 2, H, generator=g, dtype=torch.float64)  # [s, b, h], as Megatron's layers hold it
    w1 = torch.randn(FFN, H, generator=g, dtype=torch.float64) / H ** 0.5
    b1 = torch.randn(FFN, generator=g, dtype=torch.float64)
    w2 = torch.randn(H, FFN, generator=g, dtype=torch.float64) / FFN ** 0.5
    dout = torch.randn(t // 2, 2, H, generator=g, dtype=torch.float64)
    return [v.to(dtype) for v in (x, w1, b1, w2)], dout.to(dtype)


def _reference(x, w1, b1, w2, dout):
    """Autograd of gelu(x @ w1^T + b1) @ w2^T in float64: the output and the gradients of x, w1, b1, w2."""
    leaves = [v.double().requires_grad_() for v in (x, w1, b1, w2)]
    rx, rw1, rb1, rw2 = leaves
    out = _gelu_tanh(rx @ rw1.t() + rb1) @ rw2.t()
    return out.detach(), torch.autograd.grad(out, leaves, dout.double())


@pytest.mark.parametrize("zero_out_wgrad", [False, True])
def test_fusion_puts_the_gradients_into_main_grad(epilogues, monkeypatch, zero_out_wgrad):
    """As Megatron's DDP wraps parameters: an fp32 main_grad (already holding a micro-batch's sum, so an overwrite
    would show) and its hook's flag. The weight gradients are added into main_grad by the stand-in for apex's
    kernel and autograd gets a dummy (zeros where Megatron zeroes it, zero_out_wgrad: its hook adds the dummy);
    fc1's bias gradient goes into main_grad too."""
    _with_wgrad_stand_in(monkeypatch)
    (x0, w10, b10, w20), dout = _leaves(1)
    want_out, (dx, dw1, db1, dw2) = _reference(x0, w10, b10, w20, dout)

    x = x0.clone().requires_grad_()
    w1, b1, w2 = (torch.nn.Parameter(v.clone()) for v in (w10, b10, w20))
    starts = {}
    for p in (w1, b1, w2):
        starts[p] = torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()))
        p.main_grad = starts[p].clone()
        p.grad_added_to_main_grad = False
    if zero_out_wgrad:
        w1.zero_out_wgrad = w2.zero_out_wgrad = True

    out = GE._GeLUMLP.apply(x, w1, b1, w2, True, True)
    out.backward(dout)
    assert epilogues.fc1_calls == epilogues.dgelu_calls == 1
    torch.testing.assert_close(out.double(), want_out, atol=ATOL32, rtol=RTOL32)
    torch.testing.assert_close(x.grad.double(), dx, atol=ATOL32, rtol=RTOL32)
    for name, p, want in (("w1", w1, dw1), ("b1", b1, db1), ("w2", w2, dw2)):
        assert p.main_grad.dtype == torch.float32
        torch.testing.assert_close((p.main_grad - starts[p]).double(), want, atol=ATOL32, rtol=RTOL32,
                                   msg=lambda m, name=name: f"{name}.main_grad: {m}")
        assert p.grad_added_to_main_grad is True, f"{name}: Megatron's hook would add its gradient again"
        assert p.grad is not None and p.grad.shape == p.shape  # a dummy, for the hook to fire on
    if zero_out_wgrad:  # Megatron's hook adds these: they must be zeros
        assert not w1.grad.any() and not w2.grad.any()


def test_without_fusion_autograd_gets_the_gradients(epilogues):
    """No main_grad, fusion off (the CPU tests, inference): real gradients for every input, against float64."""
    (x0, w10, b10, w20), dout = _leaves(2)
    want_out, want = _reference(x0, w10, b10, w20, dout)
    leaves = [v.clone().requires_grad_() for v in (x0, w10, b10, w20)]
    out = GE._GeLUMLP.apply(*leaves, False, False)
    out.backward(dout)
    torch.testing.assert_close(out.double(), want_out, atol=ATOL32, rtol=RTOL32)
    for name, v, w in zip(("x", "w1", "b1", "w2"), leaves, want):
        torch.testing.assert_close(v.grad.double(), w, atol=ATOL32, rtol=RTOL32, msg=lambda m, n=name: f"{n}: {m}")


def test_mlp_under_fusion_gives_what_megatrons_mlp_gives(megatron_on_cpu, epilogues, monkeypatch):
    """Through the module, with config.gradient_accumulation_fusion: the gradient Megatron's DDP hook would reduce
    (main_grad, plus the .grad it adds where the flag is unset) is the same with the lever as with Megatron's
    forward (whose fc1 bias gradient comes through autograd, the lever's straight into main_grad)."""
    _with_wgrad_stand_in(monkeypatch)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")  # Megatron's linear puts its dummy there
    model = _gpt(_config(gradient_accumulation_fusion=True, num_layers=1))
    mlp = model.decoder.layers[0].mlp
    g = torch.Generator().manual_seed(3)
    x0 = torch.randn(8, 2, H, generator=g)
    dout = torch.randn(8, 2, H, generator=g)

    def run():
        for p in mlp.parameters():
            p.grad = None
            p.main_grad = torch.ones(p.shape)  # a previous micro-batch's sum
            p.grad_added_to_main_grad = False
        x = x0.clone().requires_grad_()
        out, bias = mlp(x)
        (out + bias).backward(dout)
        hook = {n: p.main_grad + (p.grad if p.grad is not None and not p.grad_added_to_main_grad else 0)
                for n, p in mlp.named_parameters()}  # what Megatron's DDP hook leaves in main_grad
        return out.detach(), x.grad, hook

    megatrons = run()
    assert _install()
    ours = run()
    assert epilogues.fc1_calls == epilogues.dgelu_calls == 1
    torch.testing.assert_close(ours[0], megatrons[0], atol=ATOL32, rtol=RTOL32)
    torch.testing.assert_close(ours[1], megatrons[1], atol=ATOL32, rtol=RTOL32)
    for n in megatrons[2]:
        torch.testing.assert_close(ours[2][n], megatrons[2][n], atol=ATOL32, rtol=RTOL32,
                                   msg=lambda m, n=n: f"{n}: {m}")


# ---------------------------------------------------------------------------- what is not eligible

def _mlp_run(mlp, x0, dout, **kwargs):
    x = x0.clone().requires_grad_()
    mlp.zero_grad(set_to_none=True)
    out, bias = mlp(x, **kwargs)
    (out if bias is None else out + bias).backward(dout)
    return out.detach(), x.grad, {n: p.grad for n, p in mlp.named_parameters()}


@pytest.mark.parametrize("overrides", [
    dict(add_bias_linear=False, bias_activation_fusion=False),  # Megatron asserts a bias for its fused GeLU
    dict(gated_linear_unit=True),  # GeGLU, fused
    dict(gated_linear_unit=True, activation_func=F.silu, bias_activation_fusion=False),  # SwiGLU
    dict(bias_activation_fusion=False),  # erf GeLU, unfused: not the epilogue's tanh
    dict(ffn_hidden_size=100),  # not a multiple of 8: cuBLASLt's alignment
], ids=["no_bias", "geglu", "swiglu", "unfused_gelu", "ffn_100"])
def test_an_ineligible_mlp_runs_megatrons_forward(megatron_on_cpu, epilogues, overrides, capsys):
    model = _gpt(_config(num_layers=1, **overrides))
    mlp = model.decoder.layers[0].mlp
    g = torch.Generator().manual_seed(4)
    x0 = torch.randn(8, 2, H, generator=g)
    dout = torch.randn(8, 2, H, generator=g)
    megatrons = _mlp_run(mlp, x0, dout)
    assert _install()
    ours = _mlp_run(mlp, x0, dout, padding_mask=None)  # the keyword argument Megatron's layer passes
    assert epilogues.fc1_calls == epilogues.dgelu_calls == 0
    torch.testing.assert_close(ours[0], megatrons[0], atol=0, rtol=0)  # the same code: the same bits
    torch.testing.assert_close(ours[1], megatrons[1], atol=0, rtol=0)
    for n in megatrons[2]:
        torch.testing.assert_close(ours[2][n], megatrons[2][n], atol=0, rtol=0)
    assert "megalab: gelu_epilogue off: Megatron forward" in capsys.readouterr().out


def test_each_condition_of_eligibility_counts(megatron_on_cpu, epilogues):
    """An eligible MLP with one thing changed at a time is no longer eligible: each check does its part."""
    mlp = _gpt(_config(num_layers=1)).decoder.layers[0].mlp
    x = torch.randn(8, 2, H)
    assert GE.eligible(mlp, x, None)
    assert not GE.eligible(mlp, x, torch.ones(16))  # a per-token scale (MoE experts)
    assert not GE.eligible(mlp, x.transpose(0, 1), None)  # not contiguous
    assert not GE.eligible(mlp, x.double(), None)  # not the weights' dtype
    with pytest.MonkeyPatch.context() as m:
        m.setattr(GE, "_device_ok", lambda x: False)  # CPU tensors, or no nvmath
        assert not GE.eligible(mlp, x, None)
    cfg = mlp.config
    for attr, value in (("bias_activation_fusion", False), ("gated_linear_unit", True), ("add_bias_linear", False),
                        ("use_te_activation_func", True), ("tensor_model_parallel_size", 2),
                        ("sequence_parallel", True), ("delay_wgrad_compute", True)):
        with pytest.MonkeyPatch.context() as m:
            m.setattr(cfg, attr, value)
            assert not GE.eligible(mlp, x, None), attr
    for obj, attr, value in ((mlp, "activation_func", F.silu), (mlp.linear_fc1, "is_expert", True),
                             (mlp.linear_fc1, "skip_bias_add", False), (mlp.linear_fc2, "skip_bias_add", False),
                             (mlp.linear_fc1, "bias", None)):
        with pytest.MonkeyPatch.context() as m:
            m.setattr(obj, attr, value)
            assert not GE.eligible(mlp, x, None), attr


# ---------------------------------------------------------------------------- the log, and installing on CPU

def test_the_log_says_on_once(megatron_on_cpu, epilogues, capsys):
    mlp = _gpt(_config(num_layers=1)).decoder.layers[0].mlp
    assert _install()
    x = torch.randn(8, 2, H, requires_grad=True)
    for _ in range(3):
        mlp(x)
    out = capsys.readouterr().out
    assert out.count("megalab: gelu_epilogue on: cuBLASLt epilogues") == 1, out
    assert "off" not in out
    assert epilogues.fc1_calls == 3


def test_install_twice_keeps_megatrons_forward(megatron_on_cpu, epilogues):
    """A second install must not take the lever's own forward for Megatron's (the fallback would recurse)."""
    assert _install() and _install()
    assert GE._MEGATRON_FORWARD is not GE.forward
    mlp = _gpt(_config(num_layers=1, ffn_hidden_size=100)).decoder.layers[0].mlp  # ineligible: the fallback
    out, _ = mlp(torch.randn(8, 2, H))
    assert out.shape == (8, 2, H)


def test_no_nvmath_installs_nothing(monkeypatch):
    """This machine: no nvmath, no CUDA. install() is False and Megatron's forward stays; so does fast path's."""
    monkeypatch.setattr(megatron_mlp.MLP, "forward", megatron_mlp.MLP.forward)
    monkeypatch.setattr(GE, "_MEGATRON_FORWARD", None)
    before = megatron_mlp.MLP.forward
    monkeypatch.setattr(GE, "Matmul", None)
    assert GE.install() is False
    assert megatron_mlp.MLP.forward is before and GE._MEGATRON_FORWARD is None
    assert fastpath.apply(["gelu_epilogue"]) == []
    assert megatron_mlp.MLP.forward is before
    # nvmath there but no GPU: still nothing
    monkeypatch.setattr(GE, "Matmul", object())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert GE.install() is False
    assert megatron_mlp.MLP.forward is before


def test_nvmath_logs_to_a_quiet_logger_of_its_own(monkeypatch):
    """nvmath logs each execute() at INFO to the root logger unless given one, and Megatron sets the root logger to
    INFO: 576 lines a step at row 111's shape wherever no CUDA graph replays the step. The plan gets megalab's own
    logger, which lets warnings through and drops INFO."""
    import logging
    from types import SimpleNamespace

    given = {}

    class _Matmul:  # records what nvmath's Matmul is given; no GPU here
        def __init__(self, a, b, options=None, stream=None):
            given.update(options or {})

        def plan(self, **kwargs):
            pass

        def execute(self, stream=None):
            return "result"

        def release_operands(self):
            pass

    monkeypatch.setattr(GE, "Matmul", _Matmul)
    monkeypatch.setattr(GE, "MatmulEpilog", SimpleNamespace(DGELU="DGELU"))
    monkeypatch.setattr(GE, "_PLANS", {})
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(GE, "_make_current", lambda device: None)  # no cuda.core here
    monkeypatch.setattr(logging.getLogger(), "level", logging.INFO)  # as Megatron sets it
    assert GE._run("DGELU", torch.ones(8, 8), torch.ones(8, 8), {}) == "result"
    log = given.get("logger")
    assert log is not None and log is not logging.getLogger(), "nvmath would log to the root logger"
    assert not log.isEnabledFor(logging.INFO) and log.isEnabledFor(logging.WARNING)


def _thread_run(fn):
    """fn() on a thread of its own, as autograd runs the backward (and full recompute's forward): its result or error."""
    import threading

    out = {}

    def target():
        try:
            out["result"] = fn()
        except Exception as e:  # noqa: BLE001 - handed back to the test
            out["error"] = e

    t = threading.Thread(target=target)
    t.start()
    t.join()
    return out


@pytest.mark.parametrize("made_current", [True, False], ids=["per-thread", "check-can-fail"])
def test_a_plan_made_on_one_thread_runs_on_another(monkeypatch, made_current):
    """Row 300 (full recompute) failed with "Device 0 is not yet initialized": its MLP forward ran again on autograd's
    thread with a plan made on the main thread. cuda.core's device is made current per thread and refuses work where it
    is not; nvmath makes it current only while planning. _run makes it current on each thread it runs on, once a
    thread. Without that (check-can-fail) the second thread fails as the GPU did."""
    import threading
    from types import SimpleNamespace

    current, calls = set(), []  # (thread, device) made current; set_current's threads

    class _Device:
        def __init__(self, index):
            self.index = index

        def set_current(self):
            calls.append(threading.get_ident())
            current.add((threading.get_ident(), self.index))

    class _Matmul:
        def __init__(self, a, b, options=None, stream=None):
            current.add((threading.get_ident(), 0))  # nvmath makes the device current while it plans

        def plan(self, **kwargs):
            pass

        def reset_operands_unchecked(self, **kwargs):
            pass

        def execute(self, stream=None):
            if (threading.get_ident(), 0) not in current:
                raise RuntimeError("Device 0 is not yet initialized, perhaps you forgot to call .set_current() first?")
            return "result"

        def release_operands(self):
            pass

    monkeypatch.setattr(GE, "Matmul", _Matmul)
    monkeypatch.setattr(GE, "Device", _Device)
    monkeypatch.setattr(GE, "MatmulEpilog", SimpleNamespace(GELU_AUX_BIAS="GELU_AUX_BIAS"))
    monkeypatch.setattr(GE, "_PLANS", {})
    monkeypatch.setattr(GE, "_THREAD", threading.local())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)  # CPU tensors here have no device index
    if not made_current:
        monkeypatch.setattr(GE, "_make_current", lambda device: None)
    run = lambda: GE._run("GELU_AUX_BIAS", torch.ones(8, 8), torch.ones(8, 8), {})  # noqa: E731
    assert run() == "result" and run() == "result"  # planned, then reused, on this thread
    other = _thread_run(run)
    if made_current:
        assert other == {"result": "result"}
        assert len(calls) == 2 and len(set(calls)) == 2, "once on each thread"
    else:
        assert "not yet initialized" in str(other.get("error"))
