"""flat_adam (megalab/runtime/flat_adam.py): AdamW over flat buffers, in one Triton kernel that also writes
the bf16 weights, gives the masters, moments and weights torch's AdamW and Megatron's copy give (CPU:
Triton's interpreter runs the kernel itself; fresh random data, two parameter groups, a grad buffer with
padding between parameters laid out in another order than the parameters, clipping's coefficient)."""
import pytest

from megalab._compat import ensure_typing_override

ensure_typing_override()

import torch  # noqa: E402

from megalab.runtime import fastpath, flat_adam  # noqa: E402

SHAPES = ((33, 7), (129,), (4, 5, 6), (5000,), (3, 4100))  # 5000 and 12300: more than one chunk
KW = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
DECAY = (0.1, 0.0)  # Megatron's two groups: weights decay, norms and biases do not


@pytest.fixture(autouse=True)
def interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _model(seed):
    """bf16 weights whose main_grads are views of one fp32 buffer: reverse order, 3 padding elements
    after each, as Megatron's DDP lays them out (NaN in the padding: the kernel must not touch it)."""
    g = torch.Generator().manual_seed(seed)
    weights = [torch.nn.Parameter(torch.randn(s, generator=g).to(torch.bfloat16)) for s in SHAPES]
    total = sum(w.numel() + 3 for w in weights)
    buffer = torch.full((total,), float("nan"))
    off = 0
    for w in reversed(weights):
        w.main_grad = buffer[off:off + w.numel()].view(w.shape)
        off += w.numel() + 3
    return weights, buffer


def _groups(params):
    return [{"params": params[0::2], "weight_decay": DECAY[0]}, {"params": params[1::2], "weight_decay": DECAY[1]}]


def _grads(seed, weights, scale):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(w.shape, generator=g) * scale for w in weights]


def _pair(seed=0):
    """(flat optimizer, its masters and weights) and (torch's AdamW, its masters) from the same start."""
    weights, buffer = _model(seed)
    masters = [w.detach().clone().float() for w in weights]
    opt = fastpath.FusedAdamW(_groups(masters), **KW)
    assert flat_adam.adopt(opt, list(zip(masters, weights))), opt.flat_adam_off
    ref_masters = [w.detach().clone().float() for w in weights]
    ref = torch.optim.AdamW(_groups(ref_masters), foreach=False, **KW)
    return opt, masters, weights, buffer, ref, ref_masters


def _step(opt, masters, weights, ref, ref_masters, seed, lr, grad_scale=None):
    for group, rgroup in zip(opt.param_groups, ref.param_groups):
        group["lr"] = rgroup["lr"] = lr  # the scheduler's per-step lr
    for m, w, g, rm in zip(masters, weights, _grads(seed, weights, 1 + seed), ref_masters):
        w.main_grad.copy_(g)
        m.grad = w.main_grad  # Megatron's _copy_model_grads_to_main_grads: the fp32 main_grad itself
        rm.grad = g / grad_scale if grad_scale is not None else g.clone()
    if grad_scale is not None:
        opt.grad_scale = torch.tensor(grad_scale)
    opt.step()
    ref.step()


def _same(opt, masters, weights, buffer, ref, ref_masters):
    for m, w, rm in zip(masters, weights, ref_masters):
        torch.testing.assert_close(m, rm, rtol=1e-6, atol=1e-7)
        st, rst = opt.state[m], ref.state[rm]
        # torch's CPU reference lerps the first moment, the CUDA kernel (and this one) multiply-adds: apart by
        # fp32 roundings where the sum nearly cancels
        torch.testing.assert_close(st["exp_avg"], rst["exp_avg"], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(st["exp_avg_sq"], rst["exp_avg_sq"], rtol=1e-6, atol=1e-12)
        assert float(st["step"]) == float(rst["step"])
        # the weight is the updated master in bf16, as Megatron's copy would leave it: within one bf16 step
        # (a GPU rounds to nearest; Triton's CPU interpreter truncates)
        assert w.dtype == torch.bfloat16
        assert ((w.detach().float() - m).abs() <= m.abs() * 2.0 ** -7).all()
    assert buffer[[w.main_grad.storage_offset() + w.numel() for w in weights]].isnan().all()  # padding untouched


def test_flat_steps_equal_torchs_adamw_and_megatrons_copy():
    """Five steps, a different lr each, both groups: masters, moments and weights as torch + copy give them."""
    opt, masters, weights, buffer, ref, ref_masters = _pair()
    start = [w.detach().clone() for w in weights]
    before = [m.detach().clone() for m in masters]
    for step in range(5):
        opt.flat_adam_wrote = False
        _step(opt, masters, weights, ref, ref_masters, step, lr=1e-2 / (step + 1))
        assert opt.flat_adam_wrote  # the kernel wrote the weights: Megatron's copy is skipped
        _same(opt, masters, weights, buffer, ref, ref_masters)
        # the weights are this step's masters, not the last step's: further from those than one bf16 step
        stale = [((w.detach().float() - b).abs() > b.abs() * 2.0 ** -7).any() for w, b in zip(weights, before)]
        assert all(stale)
        before = [m.detach().clone() for m in masters]
    assert all(not torch.equal(a, w.detach()) for a, w in zip(start, weights))  # the weights really moved
    space = opt.flat_adam[0]
    for m, w in zip(masters, weights):  # every tensor is a view of the flat buffers, at its grad's offset
        off = w.main_grad.storage_offset()
        assert m.untyped_storage().data_ptr() == space.master.untyped_storage().data_ptr()
        assert m.storage_offset() == off and w.storage_offset() == off
        assert w.untyped_storage().data_ptr() == space.weight.untyped_storage().data_ptr()


def test_the_groups_weight_decay_reaches_each_parameter():
    """A group's decay is its own: with decay swapped between the groups the weights differ."""
    opt, masters, weights, buffer, ref, ref_masters = _pair()
    opt.param_groups[0]["weight_decay"], opt.param_groups[1]["weight_decay"] = 0.0, 0.5
    ref.param_groups[0]["weight_decay"], ref.param_groups[1]["weight_decay"] = 0.0, 0.5
    for step in range(2):
        _step(opt, masters, weights, ref, ref_masters, step, lr=0.05)
    _same(opt, masters, weights, buffer, ref, ref_masters)


def test_clip_coefficient_divides_the_gradient():
    """clip_in_adam's grad_scale: the update of the gradient divided by it, then cleared."""
    opt, masters, weights, buffer, ref, ref_masters = _pair(1)
    _step(opt, masters, weights, ref, ref_masters, 0, lr=1e-2)
    _step(opt, masters, weights, ref, ref_masters, 1, lr=1e-2, grad_scale=7.0)
    assert opt.grad_scale is None
    _same(opt, masters, weights, buffer, ref, ref_masters)


def test_state_saves_and_loads_into_the_flat_buffers():
    """A checkpoint's state, loaded into a fresh flat optimizer, continues as the original does."""
    opt, masters, weights, buffer, ref, ref_masters = _pair(2)
    for step in range(2):
        _step(opt, masters, weights, ref, ref_masters, step, lr=1e-2)
    saved = {k: v for k, v in opt.state_dict().items()}
    saved = {"state": {i: {k: v.clone() for k, v in s.items()} for i, s in saved["state"].items()},
             "param_groups": saved["param_groups"]}
    opt2, masters2, weights2, buffer2, _, _ = _pair(2)
    with torch.no_grad():
        for m2, w2, m, w in zip(masters2, weights2, masters, weights):
            m2.copy_(m)  # Megatron's load copies the saved fp32 masters in
            w2.copy_(w)
    opt2.load_state_dict(saved)
    for m2 in masters2:  # the loaded moments live in the flat buffers again
        assert opt2.state[m2]["exp_avg"].untyped_storage().data_ptr() == \
            opt2.flat_adam[0].exp_avg.untyped_storage().data_ptr()
    for step in range(2, 4):
        _step(opt, masters, weights, ref, ref_masters, step, lr=1e-2)
        _step(opt2, masters2, weights2, ref, [m.detach().clone() for m in ref_masters], step, lr=1e-2)
    for a, b in zip(masters, masters2):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert float(opt2.state[masters2[0]]["step"]) == 4.0


def test_a_gradient_elsewhere_sends_the_step_back_to_torch():
    """A gradient that is not its buffer view: torch's kernel, Megatron's copy, and flat off for good."""
    opt, masters, weights, buffer, ref, ref_masters = _pair(3)
    _step(opt, masters, weights, ref, ref_masters, 0, lr=1e-2)
    for group, rgroup in zip(opt.param_groups, ref.param_groups):
        group["lr"] = rgroup["lr"] = 1e-2
    for m, w, g, rm in zip(masters, weights, _grads(9, weights, 1.0), ref_masters):
        m.grad, rm.grad = g.clone(), g.clone()  # not the main_grad views
    opt.flat_adam_wrote = False
    opt.step()
    ref.step()
    assert opt.flat_adam is None and "gradient" in opt.flat_adam_off and not opt.flat_adam_wrote
    for m, rm in zip(masters, ref_masters):
        torch.testing.assert_close(m, rm, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("change, reason", [
    (lambda opt, pairs: opt.param_groups[1].update(betas=(0.8, 0.95)), "different betas"),
    (lambda opt, pairs: opt.param_groups[0].update(amsgrad=True), "amsgrad"),
    (lambda opt, pairs: pairs.pop(), "not fp32 masters"),
    (lambda opt, pairs: delattr(pairs[0][1], "main_grad"), "main_grad"),
    (lambda opt, pairs: opt.add_param_group({"params": [torch.zeros(2)], "weight_decay": 0.0}), "not fp32 masters"),
])
def test_what_cannot_go_flat_stays_torchs(change, reason):
    weights, _ = _model(4)
    masters = [w.detach().clone().float() for w in weights]
    opt = fastpath.FusedAdamW(_groups(masters), **KW)
    pairs = list(zip(masters, weights))
    change(opt, pairs)
    before = [m.data_ptr() for m in masters]
    assert not flat_adam.adopt(opt, pairs)
    assert reason in opt.flat_adam_off and getattr(opt, "flat_adam", None) is None
    assert [m.data_ptr() for m in masters] == before  # nothing moved
    assert not flat_adam.step(opt)


def test_too_many_groups_stay_torchs():
    weights, _ = _model(5)
    masters = [w.detach().clone().float() for w in weights]
    opt = fastpath.FusedAdamW([{"params": [m]} for m in masters], **KW)
    assert not flat_adam.adopt(opt, list(zip(masters, weights)))
    assert "parameter groups" in opt.flat_adam_off


def test_megatrons_optimizer_adopts_and_skips_its_copy_after_a_flat_step(monkeypatch):
    """Installed, Megatron's Float16OptimizerWithFloat16Params hands its pairs over after construction and
    skips its master-to-weight copy for a step the kernel wrote; otherwise it copies as before."""
    from megatron.core.optimizer import optimizer as optmod

    cls = optmod.Float16OptimizerWithFloat16Params
    monkeypatch.setattr(cls, "__init__", cls.__init__)
    monkeypatch.setattr(cls, "_copy_main_params_to_model_params", cls._copy_main_params_to_model_params)
    monkeypatch.setattr(cls, "_megalab_flat_adam", False, raising=False)
    monkeypatch.setattr(flat_adam, "_ACCEPTS", [])
    assert flat_adam.install(fastpath.FusedAdamW)
    weights, _ = _model(6)
    masters = [w.detach().clone().float() for w in weights]
    meg = object.__new__(cls)  # Megatron's __init__ wants CUDA: the groups it builds, by hand
    meg.optimizer = fastpath.FusedAdamW(_groups(masters), **KW)
    meg.float16_groups = [weights[0::2], weights[1::2]]
    meg.fp32_from_float16_groups = [masters[0::2], masters[1::2]]
    meg.fp32_from_fp32_groups = [[], []]
    meg.is_stub_optimizer = False
    meg._dummy_overflow_buf = None
    assert flat_adam.after_init(meg) and meg.optimizer.flat_adam
    other = object.__new__(cls)  # another torch optimizer: left to torch and Megatron
    other.optimizer, other.is_stub_optimizer = torch.optim.SGD([torch.zeros(2)], lr=0.1), False
    assert not flat_adam.after_init(other)
    with torch.no_grad():
        masters[0].add_(1.0)
    meg.optimizer.flat_adam_wrote = True
    meg._copy_main_params_to_model_params()
    assert not torch.equal(weights[0].detach(), masters[0].to(torch.bfloat16))  # skipped: the kernel wrote
    assert not meg.optimizer.flat_adam_wrote
    meg._copy_main_params_to_model_params()
    assert torch.equal(weights[0].detach(), masters[0].to(torch.bfloat16))  # not a flat step: Megatron copies


def _norm_check():
    """Run by the test below in a fresh interpreter: Triton's own reductions (tl.sum) are interpreted only
    where TRITON_INTERPRET was set before Triton was imported."""
    opt, masters, weights, buffer, ref, ref_masters = _pair(7)
    for w, g in zip(weights, _grads(3, weights, 2.0)):
        w.main_grad.copy_(g)
    grads = [w.main_grad for w in weights]
    want = torch.sqrt(sum((g.double() ** 2).sum() for g in grads))
    got = flat_adam.grad_norm(grads)
    assert got is not None and got.shape == (1,) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want.reshape(1), rtol=1e-6, atol=0)
    total, _ = fastpath.foreach_l2_norm(2048, None, [grads], False)  # what Megatron's clip calls
    assert torch.equal(total, got)
    assert flat_adam.grad_norm(grads[1:]) is None  # a subset: not the space's norm
    assert flat_adam.grad_norm([g.clone() for g in grads]) is None  # copies elsewhere
    torch.testing.assert_close(fastpath.foreach_l2_norm(2048, None, [grads[1:]], False)[0].double(),
                               torch.sqrt(sum((g.double() ** 2).sum() for g in grads[1:])).reshape(1), rtol=1e-6, atol=0)
    print("norm ok")


def test_the_clips_norm_reads_the_flat_table_and_only_for_exactly_its_gradients():
    """foreach_norm's total over a space's gradients: one kernel over the table (the NaN padding unread),
    equal to the norm in float64; any other set of tensors goes the foreach way."""
    from tests.conftest import interpreted

    out = interpreted("import test_flat_adam as t; t._norm_check()", timeout=300)
    assert out.returncode == 0 and "norm ok" in out.stdout, out.stderr[-3000:]


def test_moments_are_made_at_the_first_step_and_a_first_step_fallback_is_torchs():
    """No moment buffers before the first step (torch makes its state then too: the memory the first step's
    activations freed); a fallback at the very first step leaves torch a state to make afresh."""
    opt, masters, weights, buffer, ref, ref_masters = _pair(8)
    assert opt.flat_adam[0].exp_avg is None and all("exp_avg" not in opt.state[m] for m in masters)
    for group, rgroup in zip(opt.param_groups, ref.param_groups):
        group["lr"] = rgroup["lr"] = 1e-2
    for m, w, g, rm in zip(masters, weights, _grads(4, weights, 1.0), ref_masters):
        m.grad, rm.grad = g.clone(), g.clone()  # not the buffer views: torch's kernel from the first step
    opt.step()
    ref.step()
    assert opt.flat_adam is None
    for m, rm in zip(masters, ref_masters):
        torch.testing.assert_close(m, rm, rtol=1e-6, atol=1e-7)
        assert float(opt.state[m]["step"]) == 1.0
