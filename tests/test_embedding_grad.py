"""embed_wgrad (megalab/runtime/embedding_grad.py): the word embedding's gradient added into main_grad by
the lookup's own backward gives the main_grad Megatron's dense gradient and DDP hook give (CPU, float64,
repeated tokens, two micro-batches), and the hook really skipped its add."""
from types import SimpleNamespace

import pytest

from megalab._compat import ensure_typing_override

ensure_typing_override()

import torch  # noqa: E402

from megalab.runtime import embedding_grad  # noqa: E402

V, H = 37, 6


class _DDPStub:
    """What Megatron's backward post-hook reads off its DDP module: no overlap, one process."""

    ddp_config = SimpleNamespace(overlap_grad_reduce=False)
    force_all_reduce = False

    def __init__(self, params):
        self.param_to_bucket_group = {p: None for p in params}


def _embedding(tied: bool):
    from megatron.core.distributed.distributed_data_parallel import DistributedDataParallel
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.tensor_parallel.layers import VocabParallelEmbedding

    cfg = ModelParallelConfig(use_cpu_initialization=True, params_dtype=torch.float64)
    emb = VocabParallelEmbedding(V, H, init_method=torch.nn.init.normal_, config=cfg)
    w = emb.weight
    w.main_grad = torch.zeros(V, H, dtype=torch.float64)  # DDP's buffer view
    w.grad_added_to_main_grad = False
    if tied:
        w.zero_out_wgrad = True  # what LanguageModule sets on GPT-2's shared table
    # Megatron's own hook, registered as its DDP registers it
    stub = _DDPStub([w])
    acc = w.expand_as(w).grad_fn.next_functions[0][0]
    acc.register_hook(DistributedDataParallel._make_backward_post_hook(stub, w))
    return emb, acc


def _train(emb, batches, proj):
    for ids in batches:
        emb.weight.grad_added_to_main_grad = False  # DDP resets it in zero_grad_buffer, per step
        (emb(ids) * proj).sum().backward()
    return emb.weight.main_grad.clone()


@pytest.fixture
def installed(world1, monkeypatch):
    from megatron.core.tensor_parallel import layers

    monkeypatch.setattr(layers, "F", layers.F)  # undone after the test
    assert embedding_grad.install() and embedding_grad.install()  # twice: the second is a no-op
    return layers


def _batches(seed):
    g = torch.Generator().manual_seed(seed)
    # [b, s] ids with many repeats (V is small): the rows that meet in one index_add
    return [torch.randint(0, V, (3, 11), generator=g) for _ in range(2)]


def test_main_grad_equals_megatrons_and_the_hook_skipped_its_add(world1, installed):
    batches, proj = _batches(1), torch.randn(H, dtype=torch.float64)
    torch.manual_seed(0)
    ref, ref_acc = _embedding(tied=False)
    installed.F = embedding_grad.F  # Megatron's lookup for the reference
    want = _train(ref, batches, proj)
    assert ref.weight.grad_added_to_main_grad is False  # the dense gradient went through the hook's add
    installed.F = embedding_grad._Functional("megalab_functional")
    torch.manual_seed(0)
    got, got_acc = _embedding(tied=False)
    torch.testing.assert_close(got.weight, ref.weight)
    have = _train(got, batches, proj)
    assert got.weight.grad_added_to_main_grad is True  # the lookup's backward added it, the hook did not
    assert got.weight.grad is None
    torch.testing.assert_close(have, want, atol=1e-12, rtol=1e-12)
    assert have.abs().sum() > 0 and (have != 0).any(dim=1).sum() < V  # rows untouched stay zero


def test_tied_table_is_left_to_megatron(world1, installed):
    """GPT-2's shared table: the output layer's zeroed stand-in and Megatron's add stay as they are."""
    batches, proj = _batches(2), torch.randn(H, dtype=torch.float64)
    torch.manual_seed(0)
    emb, _ = _embedding(tied=True)
    have = _train(emb, batches, proj)
    assert emb.weight.grad_added_to_main_grad is False
    dense = torch.zeros(V, H, dtype=torch.float64)
    for ids in batches:
        dense.index_put_((ids.reshape(-1),), proj.expand(ids.numel(), H).clone(), accumulate=True)
    torch.testing.assert_close(have, dense, atol=1e-12, rtol=1e-12)


def test_without_main_grad_or_autograd_it_is_f_embedding(world1, installed):
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.tensor_parallel.layers import VocabParallelEmbedding

    cfg = ModelParallelConfig(use_cpu_initialization=True, params_dtype=torch.float64)
    emb = VocabParallelEmbedding(V, H, init_method=torch.nn.init.normal_, config=cfg)
    ids = _batches(3)[0]
    emb(ids).sum().backward()  # no DDP: the ordinary dense gradient
    assert emb.weight.grad is not None and emb.weight.grad.shape == (V, H)
    with torch.no_grad():
        torch.testing.assert_close(emb(ids), emb.weight[ids])
