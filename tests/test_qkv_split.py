"""qkv_pack (megalab/runtime/qkv_split.py): the split's backward packs the query, key and value gradients exactly as
torch.cat does, whatever strides they come with, and sums the QKV bias's gradient (also straight into an fp32
main_grad) as float64 does; inside Megatron's own GPT (multi-head and grouped-query) the loss and every gradient
are those of Megatron's split and linear layer. Checks that must fail: the linear layer still summing the bias,
pieces packed out of order. Triton's interpreter on CPU, in a fresh interpreter (Triton reads TRITON_INTERPRET
when it is imported)."""
import pytest

from tests.conftest import applied, interpreted


class _Ctx:
    """What _SplitWithBias.backward reads from its ctx."""

    def __init__(self, sizes, shape, bias, needs_bias):
        self.sizes, self.shape, self.bias = sizes, shape, bias
        self.needs_input_grad = (True, needs_bias, False)


def _check():
    import torch

    from megalab._compat import ensure_typing_override

    ensure_typing_override()
    from megalab.runtime import qkv_split as Q

    # (s, b, groups, sizes): multi-head; grouped-query (two query heads a group); a ragged token count over several
    # programs (the interpreter counts one SM), widths that are not powers of two
    for s, b, heads, sizes in ((3, 1, 1, (4, 4, 4)), (5, 3, 2, (8, 4, 4)), (Q.BLOCK_TOKENS + 9, 2, 3, (10, 5, 5))):
        W = sum(sizes)
        g = torch.Generator().manual_seed(s * b * heads)
        grads = []
        for i, w in enumerate(sizes):
            t = torch.randn(s, b, heads, w, generator=g)
            if i == 1:  # key: laid out [b, heads, s, w], as an attention kernel may return it
                t = t.permute(1, 2, 0, 3).contiguous().permute(2, 0, 1, 3)
            if i == 2:  # value: a slice of a wider tensor (its rows not adjacent)
                t = torch.randn(s, b, heads, w + 3, generator=g)[..., 1:w + 1]
                assert not t.is_contiguous() and t.stride(-1) == 1
            grads.append(t.to(torch.bfloat16))
        want = torch.cat(grads, dim=-1)
        want_bias = want.double().sum(dim=(0, 1)).reshape(-1)
        for into_main_grad in (False, True):
            bias = torch.nn.Parameter(torch.zeros(heads * W, dtype=torch.bfloat16))
            start = torch.randn(heads * W, generator=g)
            if into_main_grad:  # as Megatron's DDP wraps a parameter
                bias.main_grad = start.clone()
                bias.grad_added_to_main_grad = False
            packed, dbias, _ = Q._SplitWithBias.backward(_Ctx(sizes, (s, b, heads, W), bias, True), *grads)
            assert torch.equal(packed, want), (s, b, heads, sizes)
            got = (bias.main_grad.double() - start.double()) if into_main_grad else dbias.double()
            tol = 1e-5 * max(1.0, want_bias.abs().max().item()) if into_main_grad else 2 ** -7 * want_bias.abs().max()
            assert (got - want_bias).abs().max() <= tol, (s, b, heads, sizes, into_main_grad)
            if into_main_grad:
                assert bias.grad_added_to_main_grad, "the hook's flag was not set"
        # an output no one used gets a zero gradient; no bias gradient asked: no sums
        packed, dbias, _ = Q._SplitWithBias.backward(_Ctx(sizes, (s, b, heads, W), bias, False), grads[0], None,
                                                     grads[2])
        assert dbias is None
        assert torch.equal(packed, torch.cat((grads[0], torch.zeros_like(grads[1]), grads[2]), dim=-1))
    print("qkv_split ok")


def _gpt(groups: int = 4, wrong: str = ""):
    """In the fresh interpreter: Megatron's GPT with megalab's spec and addmm_bias, its attention's split run by the
    lever against Megatron's torch.split (the lever off): the loss and every gradient agree, each layer's split took
    the bias, and the linear layer summed nothing."""
    from conftest import assert_same_run, tiny_gpt

    import torch

    from megalab.runtime import fastpath
    from megalab.runtime import qkv_split as Q
    from megalab.runtime import levers

    assert fastpath.apply(["addmm_bias", "qkv_pack"]) == ["addmm_bias", "qkv_pack"]
    calls = []
    apply = Q._SplitWithBias.apply

    def counted(mixed, bias, sizes):
        calls.append(sizes)
        return apply(mixed, bias, sizes)

    Q._SplitWithBias.apply = counted
    if wrong == "bias-twice":  # the linear layer not told: its backward sums the bias too
        take = Q._linear_node

        def untold(mixed):
            node = take(mixed)
            if node is not None:
                class Node:
                    megalab_bias, use_bias = node.megalab_bias, True
                return Node()
            return None

        Q._linear_node = untold
    if wrong == "order":  # key and value packed in each other's columns
        backward = Q._SplitWithBias.backward
        Q._SplitWithBias.backward = staticmethod(lambda ctx, q, k, v: backward(ctx, q, v, k))
    with tiny_gpt(hidden_dropout=0.0, num_query_groups=groups) as (model, run):
        ours = run()
        layers = model.config.num_layers
        assert len(calls) == layers, calls  # each layer's QKV split
        levers.mark_applied(levers.applied() - {"qkv_pack"})
        megatron = run()
        assert len(calls) == layers, "the split ran with the lever off"
        assert_same_run(ours, megatron)
    print("qkv_split gpt ok")


def test_the_pack_is_torch_cat_and_the_bias_its_sum():
    out = interpreted("import test_qkv_split as t; t._check()")
    assert out.returncode == 0 and "qkv_split ok" in out.stdout, out.stderr[-3000:]


@pytest.mark.parametrize("groups", [4, 2])
def test_qkv_pack_is_megatrons_gpt(groups):
    out = interpreted(f"import test_qkv_split as t; t._gpt({groups})")
    assert out.returncode == 0 and "qkv_split gpt ok" in out.stdout, out.stderr[-3000:]


@pytest.mark.parametrize("wrong", ["bias-twice", "order"])
def test_a_wrong_qkv_pack_is_caught(wrong):
    out = interpreted(f"import test_qkv_split as t; t._gpt(4, {wrong!r})")
    assert out.returncode != 0 and "AssertionError" in out.stderr, out.stderr[-3000:]


def test_qkv_pack_needs_addmm_bias(monkeypatch):
    """Its bias comes from addmm_bias's forward: alone it is not applied, and Megatron's split stays."""
    from megalab._compat import ensure_typing_override

    ensure_typing_override()
    from megatron.core.transformer import attention

    from megalab.runtime import fastpath

    monkeypatch.setattr(attention, "SplitAlongDim", attention.SplitAlongDim)
    before = attention.SplitAlongDim
    assert fastpath.apply(["qkv_pack"]) == []
    assert attention.SplitAlongDim is before


def test_without_the_lever_or_a_bias_the_split_is_torchs():
    """Off, on a tensor no linear layer of megalab's made, or in inference: torch.split's own views."""
    import torch

    from megalab.runtime import qkv_split as Q

    x = torch.randn(2, 1, 2, 6, requires_grad=True)
    for on in (False, True):
        with applied(["qkv_pack"] if on else []):
            parts = Q.split_along_dim(x * 1, 3, [2, 2, 2])
        assert [p.grad_fn.name() for p in parts] == ["SplitWithSizesBackward0"] * 3


def test_a_split_into_other_than_three_pieces_stays_torchs(monkeypatch):
    """A split of megalab's linear layer's output into two pieces (cross-attention's key and value): torch.split's
    views, not the three-piece pack, whose backward could not take it. GPT (megalab's models) splits into three."""
    import types

    import torch

    from megalab.runtime import qkv_split as Q

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    x = torch.randn(2, 1, 2, 4, requires_grad=True)
    bias = torch.nn.Parameter(torch.zeros(8))
    monkeypatch.setattr(Q, "_linear_node", lambda mixed: types.SimpleNamespace(megalab_bias=bias, use_bias=True))
    with applied(["qkv_pack"]):
        parts = Q.split_along_dim(x * 1, 3, [2, 2])
    assert [p.grad_fn.name() for p in parts] == ["SplitWithSizesBackward0"] * 2
