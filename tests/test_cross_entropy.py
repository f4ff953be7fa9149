"""megalab/runtime/cross_entropy.py against Megatron's vocab_parallel_cross_entropy (CPU, gloo).

The loss and the logits' gradient must match the definition (-log softmax, and its gradient) in
float64 to 1e-12, at TP=1 and at TP=2 with each rank holding half the vocabulary; and Megatron's
function as closely as two fp32 computations of the same sums can (Megatron computes in fp32 even
for float64 logits), on bf16 logits with the gradient within one bf16 rounding.
"""
import pytest
import torch
import torch.distributed as dist

from tests.conftest import RANKS, free_port, start_ranks

S, B, V = 8, 3, 40


def _megatron(logits, target, group, smoothing=0.0):
    from megatron.core.tensor_parallel.cross_entropy import _VocabParallelCrossEntropy

    return _VocabParallelCrossEntropy.apply(logits, target, smoothing, group)


def _grad_out(target):
    """The loss's incoming gradient (fp32 values, any loss dtype holds them exactly)."""
    return torch.linspace(0.5, 1.5, target.numel(), dtype=torch.float32, device=target.device).view_as(target)


def _both(logits, target, group):
    """(loss, dlogits) from Megatron's function and from ours, for the same incoming gradient."""
    from megalab.runtime import cross_entropy

    g = _grad_out(target)
    out = []
    for fn in (_megatron, cross_entropy.cross_entropy):
        x = logits.clone().requires_grad_()
        loss = fn(x, target, group)
        loss.backward(g.to(loss.dtype))
        out.append((loss.detach(), x.grad))
    return out


def test_matches_megatron_in_float64(world1):
    torch.manual_seed(0)
    logits = torch.randn(S, B, V, dtype=torch.float64) * 4
    target = torch.randint(0, V, (S, B))
    (l_ref, g_ref), (l, g) = _both(logits, target, dist.group.WORLD)
    torch.testing.assert_close(l, l_ref.to(l.dtype), rtol=1e-6, atol=1e-6)  # Megatron's sums ran in fp32
    torch.testing.assert_close(g, g_ref.to(g.dtype), rtol=1e-6, atol=1e-7)
    x = logits.clone().requires_grad_()  # the definition, in float64: ours is exact to it
    ref = torch.nn.functional.cross_entropy(x.view(-1, V), target.view(-1), reduction="none")
    ref.backward(_grad_out(target).view(-1).double())
    torch.testing.assert_close(l.view(-1), ref.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g, x.grad, rtol=1e-12, atol=1e-12)


def test_bf16_logits_stay_bf16_and_match(world1):
    torch.manual_seed(1)
    logits = (torch.randn(S, B, V) * 4).bfloat16()
    target = torch.randint(0, V, (S, B))
    (l_ref, g_ref), (l, g) = _both(logits, target, dist.group.WORLD)
    assert l.dtype == torch.float32 and g.dtype == torch.bfloat16
    torch.testing.assert_close(l, l_ref, rtol=1e-6, atol=1e-6)
    # both round an fp32 gradient to bf16 once: at most one bf16 step apart
    torch.testing.assert_close(g.float(), g_ref.float(), rtol=2 ** -7, atol=1e-6)


def test_install_routes_megatron_and_leaves_label_smoothing_to_it(world1):
    from megatron.core import tensor_parallel

    from megalab.runtime import cross_entropy

    original = tensor_parallel.vocab_parallel_cross_entropy
    try:
        assert cross_entropy.install()
        patched = tensor_parallel.vocab_parallel_cross_entropy
        assert patched is not original and patched.MEGALAB
        assert cross_entropy.install() and tensor_parallel.vocab_parallel_cross_entropy is patched
        torch.manual_seed(2)
        logits = torch.randn(S, B, V, dtype=torch.float64)
        target = torch.randint(0, V, (S, B))
        ours = patched(logits, target)
        assert ours.dtype == torch.float64  # ours, not Megatron's (which returns fp32 here)
        torch.testing.assert_close(ours, _megatron(logits, target, dist.group.WORLD).double(), rtol=1e-6, atol=1e-6)
        smooth = patched(logits, target, 0.1, tp_group=dist.group.WORLD)
        assert smooth.dtype == torch.float32  # Megatron's
        torch.testing.assert_close(smooth, _megatron(logits, target, dist.group.WORLD, 0.1))
        assert not torch.allclose(smooth.double(), ours)  # smoothing did reach Megatron's
    finally:
        tensor_parallel.vocab_parallel_cross_entropy = original


def _tp2_worker(rank, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)  # the same full logits on both ranks; each keeps its half of the vocabulary
        full = torch.randn(S, B, V, dtype=torch.float64) * 4
        target = torch.randint(0, V, (S, B))
        half = full.chunk(2, dim=-1)[rank].contiguous()
        (l_ref, g_ref), (l, g) = _both(half, target, dist.group.WORLD)
        torch.testing.assert_close(l, l_ref.to(l.dtype), rtol=1e-6, atol=1e-6)  # Megatron's sums ran in fp32
        torch.testing.assert_close(g, g_ref.to(g.dtype), rtol=1e-6, atol=1e-7)
        x = full.clone().requires_grad_()
        ref = torch.nn.functional.cross_entropy(x.view(-1, V), target.view(-1), reduction="none")
        ref.backward(_grad_out(target).view(-1).double())
        torch.testing.assert_close(l.view(-1), ref.detach(), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(g, x.grad.chunk(2, dim=-1)[rank], rtol=1e-12, atol=1e-12)
    finally:
        dist.destroy_process_group()


@RANKS
def test_tp2_matches_megatron_and_the_full_vocabulary():
    start_ranks(_tp2_worker, 2, free_port())


@pytest.mark.gpu
def test_compiled_kernels_match_on_cuda():
    """On the rig: the torch.compile'd kernels against the eager functions, bf16 logits."""
    from megalab.runtime import cross_entropy as C

    torch.manual_seed(3)
    x = (torch.randn(4096, 50304, device="cuda") * 3).bfloat16()
    t = torch.randint(0, 50257, (4096,), device="cuda")
    m = C._row_max(x)
    torch.testing.assert_close(C._kernel(C._row_max, x)(x), m)
    se, pk = C._sum_exp_and_target(x, m, t, 0, 50304)
    se2, pk2 = C._kernel(C._sum_exp_and_target, x)(x, m, t, 0, 50304)
    torch.testing.assert_close(se2, se, rtol=1e-5, atol=0)
    torch.testing.assert_close(pk2, pk)
    lse, g = m + torch.log(se), torch.rand(4096, device="cuda")
    torch.testing.assert_close(C._kernel(C._grad, x)(x, lse, t, 0, 50304, g).float(),
                               C._grad(x, lse, t, 0, 50304, g).float(), rtol=2 ** -7, atol=1e-7)


@pytest.mark.gpu
def test_cuda_loss_matches_megatron_and_replays_in_a_cuda_graph():
    """On the rig: the whole autograd function on bf16 CUDA logits against Megatron's, then the same
    forward+backward captured in a CUDA graph after warm-up (as Megatron's full-iteration graph does) and
    replayed on new logits: the replay must give what an eager call gives."""
    from megalab.runtime import cross_entropy as C

    own = not dist.is_initialized()
    if own:
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        _check_cuda_loss_and_graph(C)
    finally:
        if own:
            dist.destroy_process_group()


def _check_cuda_loss_and_graph(C):
    torch.manual_seed(4)
    logits = (torch.randn(512, 3, 50304, device="cuda") * 3).bfloat16()
    target = torch.randint(0, 50257, (512, 3), device="cuda")
    (l_ref, g_ref), (l, g) = _both(logits, target, dist.group.WORLD)
    torch.testing.assert_close(l, l_ref.to(l.dtype), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(g.float(), g_ref.float(), rtol=2 ** -7, atol=1e-7)

    x = logits.clone().requires_grad_()
    grad_out = _grad_out(target)

    def step():
        x.grad = None
        loss = C.cross_entropy(x, target, dist.group.WORLD)
        loss.backward(grad_out)
        return loss

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # compile and warm up outside the capture
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    fresh = (torch.randn(512, 3, 50304, device="cuda") * 3).bfloat16()
    with torch.no_grad():
        x.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    want_loss, want_grad = _both(fresh, target, dist.group.WORLD)[1]
    torch.testing.assert_close(captured, want_loss, rtol=0, atol=0)
    torch.testing.assert_close(x.grad, want_grad, rtol=0, atol=0)
