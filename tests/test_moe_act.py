"""moe_act (megalab/runtime/moe_act.py) is Megatron's expert activation times the router prob, `(gelu(h) * p).to(h's
dtype)`, with its gradients for h and p, in Triton's interpreter on CPU (the kernels themselves run). Triton reads
TRITON_INTERPRET when it is imported, so the checks run in a fresh interpreter."""
from tests.conftest import interpreted


def _check(wrong: str = ""):
    import torch
    import torch.nn.functional as F

    from megalab.runtime import moe_act as M

    if wrong == "no-prob-in-dh":  # an input gradient that forgets the prob must fail the check below
        backward = M._WeightedGeLU.backward
        M._WeightedGeLU.backward = staticmethod(lambda ctx, dy: (lambda dh, dp: (dh / ctx.saved_tensors[1][:, None].to(
            dh.dtype), dp))(*backward(ctx, dy)))
    # rows: one, a ragged last block; columns: fewer than a block, not a power of two, more than a block
    for rows, n in ((1, 8), (M.BLOCK_ROWS * 2 + 3, 40), (5, M.BLOCK_COLS + 24)):
        for dtype in (torch.float32, torch.bfloat16):
            g = torch.Generator().manual_seed(rows * n)
            h = (torch.randn(rows, n, generator=g, dtype=torch.float64) * 2).to(dtype)
            p = torch.rand(rows, generator=g, dtype=torch.float64).float()
            dy = torch.randn(rows, n, generator=g, dtype=torch.float64).to(dtype)
            assert M.eligible(h, p)
            hh, pp = h.clone().requires_grad_(), p.clone().requires_grad_()
            y = M.weighted_gelu(hh, pp)
            y.backward(dy)
            rh, rp = h.double().requires_grad_(), p.double().requires_grad_()
            ry = F.gelu(rh) * rp.unsqueeze(-1)  # Megatron's arithmetic, in float64
            ry.backward(dy.double())
            tol = {torch.float32: 1e-5, torch.bfloat16: 2 ** -7}[dtype]
            assert y.dtype == dtype
            torch.testing.assert_close(y.double(), ry, rtol=tol, atol=tol)
            torch.testing.assert_close(hh.grad.double(), rh.grad, rtol=tol, atol=tol)
            torch.testing.assert_close(pp.grad.double(), rp.grad, rtol=1e-4, atol=1e-4 * n)
    print("ok")


def test_weighted_gelu_matches_megatrons_activation_times_probs():
    r = interpreted("import test_moe_act as t; t._check()")
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_a_wrong_derivative_fails_the_check():
    r = interpreted("import test_moe_act as t; t._check('no-prob-in-dh')")
    assert r.returncode != 0 and "Mismatched elements" in r.stderr, r.stderr[-3000:]
