"""megalab/runtime/cp_attention.py: each CP mode against plain causal attention on the whole sequence.

CPU only: gloo process groups in spawned processes, tiny shapes, fp64. Each rank gets the two
load-balanced chunks Megatron's get_batch_on_this_cp_rank gives it; outputs and the gradients of
q, k and v must match single-process attention (and its autograd) on the full sequence.
"""
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from megalab.runtime import cp_attention as C

B, HEADS, SEQ, DIM = 2, 4, 16, 8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _local(x, rank, cp, dim=2):
    """This rank's share, as megatron.core.utils.get_batch_on_this_cp_rank cuts it."""
    chunks = x.chunk(2 * cp, dim)
    return torch.cat([chunks[c] for c in C.chunk_ids(rank, cp)], dim)


def _worker(rank, cp, port, modes):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=cp)
    try:
        for mode in modes:
            _check(rank, cp, mode)
    finally:
        dist.destroy_process_group()


def _check(rank, cp, mode):
    torch.manual_seed(0)  # same full tensors on every rank
    q, k, v, dout = (torch.randn(B, HEADS, SEQ, DIM, dtype=torch.float64) for _ in range(4))
    scale = DIM ** -0.5
    ql, kl, vl = (_local(t, rank, cp).requires_grad_() for t in (q, k, v))
    out = C.attention(ql, kl, vl, mode, dist.group.WORLD, scale)
    out.backward(_local(dout, rank, cp))
    if mode != "a2a":  # [s, b, n, d] memory: SDPAttention's reshape to [s, b, n*d] copies nothing
        assert out.permute(2, 0, 1, 3).is_contiguous()

    qf, kf, vf = (t.clone().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(qf, kf, vf, is_causal=True, scale=scale)
    ref.backward(dout)
    for name, ours, theirs in [("out", out, ref), ("dq", ql.grad, qf.grad),
                               ("dk", kl.grad, kf.grad), ("dv", vl.grad, vf.grad)]:
        torch.testing.assert_close(ours, _local(theirs, rank, cp), rtol=1e-9, atol=1e-9,
                                   msg=lambda m: f"{mode} cp={cp} rank {rank} {name}: {m}")


@pytest.mark.parametrize("cp", [2, 4])
def test_every_cp_mode_matches_full_causal_attention(cp):
    # One set of processes per CP size runs all three modes; fork, not spawn: a fresh
    # interpreter per process would cost seconds, the attention itself milliseconds.
    mp.start_processes(_worker, args=(cp, _free_port(), C.MODES), nprocs=cp, join=True, start_method="fork")


def test_natural_order_round_trip():
    x = torch.arange(24).view(1, 1, 24, 1)
    cp = 3
    rank_ordered = torch.cat([_local(x, r, cp) for r in range(cp)], dim=2)
    assert torch.equal(C.to_natural_order(rank_ordered, cp, 2), x)
    assert torch.equal(C.from_natural_order(x, cp, 2), rank_ordered)


@pytest.mark.parametrize("causal", [True, False])
def test_math_block_backward_matches_autograd(causal):
    torch.manual_seed(1)
    q, k, v, dout = (torch.randn(1, 2, 6, 4, dtype=torch.float64) for _ in range(4))
    qa, ka, va = (t.clone().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(qa, ka, va, is_causal=causal, scale=0.5)
    ref.backward(dout)
    out, lse = C.block_forward(q, k, v, causal, 0.5)
    torch.testing.assert_close(out, ref.detach())
    grads = C.block_backward(dout, q, k, v, out, lse, causal, 0.5)
    for g, t in zip(grads, (qa, ka, va)):
        torch.testing.assert_close(g.double(), t.grad, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------ on GPUs (skipped on CPU machines)
# The fused path (flash-attention kernels that return the log-sum-exp) only runs on CUDA in bf16.
# `MEGALAB_GPU_TESTS=1 python -m pytest -q tests/test_cp_attention.py` on the GPU rig runs these too.

def cuda(test):  # GPU-only: marked gpu (skipped unless asked for), and skipped where no GPU is
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")(test))


@cuda
@pytest.mark.parametrize("causal", [True, False])
def test_fused_block_matches_math_in_bf16(causal):
    torch.manual_seed(2)
    q, k, v, dout = (torch.randn(2, 4, 256, 96, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = C.block_forward(q, k, v, causal, 0.1)
    ref_out, ref_lse = C.block_forward(*(t.float() for t in (q, k, v)), causal, 0.1)
    torch.testing.assert_close(out.float(), ref_out, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, ref_lse, atol=1e-3, rtol=1e-3)
    grads = C.block_backward(dout, q, k, v, out, lse, causal, 0.1)
    ref = C.block_backward(*(t.float() for t in (dout, q, k, v, out)), lse, causal, 0.1)
    for g, r in zip(grads, ref):
        torch.testing.assert_close(g.float(), r, atol=5e-2, rtol=5e-2)  # the fused kernel returns bf16


def _nccl_worker(rank, cp, port):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=cp)
    try:
        torch.manual_seed(0)
        shape = (2, 8, 2048, 96)
        q, k, v, dout = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        qf, kf, vf = (t.clone().requires_grad_() for t in (q, k, v))
        ref = F.scaled_dot_product_attention(qf, kf, vf, is_causal=True, scale=0.1)
        ref.backward(dout)
        for mode in C.MODES:
            ql, kl, vl = (_local(t, rank, cp).requires_grad_() for t in (q, k, v))
            out = C.attention(ql, kl, vl, mode, dist.group.WORLD, 0.1)
            out.backward(_local(dout, rank, cp))
            for name, ours, theirs in [("out", out, ref), ("dq", ql.grad, qf.grad),
                                       ("dk", kl.grad, kf.grad), ("dv", vl.grad, vf.grad)]:
                torch.testing.assert_close(ours.float(), _local(theirs, rank, cp).float(), atol=3e-2, rtol=3e-2,
                                           msg=lambda m: f"{mode} rank {rank} {name}: {m}")
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_every_cp_mode_on_two_gpus_with_nccl_in_bf16():
    mp.spawn(_nccl_worker, args=(2, _free_port()), nprocs=2, join=True)
