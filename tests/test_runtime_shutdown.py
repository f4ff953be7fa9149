"""megalab/runtime/pretrain_gpt.shutdown: CUDA graphs released before the process groups go.

The multi-GPU CUDA_GRAPH=1 exit hang (pytorch/pytorch#115388) comes from tearing NCCL down while a
graph that captured its collectives is alive. The GPU session shows the real runs ending; here the
order and the bookkeeping are checked on CPU with a stand-in graph and a gloo group.
"""
import torch.distributed as dist

from conftest import free_port


class FakeGraph:
    def __init__(self, log):
        self.log = log

    def reset(self):
        self.log.append(("reset", dist.is_initialized()))


def test_shutdown_resets_graphs_then_destroys_groups(capsys, monkeypatch):
    from megatron.core import parallel_state
    from megatron.core.full_cuda_graph import FullCudaGraphWrapper
    from megatron.core.optimizer.optimizer_cuda_graph import OptimizerCudaGraphWrapper

    from megalab.runtime import pretrain_gpt

    if dist.is_initialized() or parallel_state.model_parallel_is_initialized():
        import pytest

        pytest.skip("another test holds a process group")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    log = []
    monkeypatch.setitem(FullCudaGraphWrapper.cuda_graph, "training", FakeGraph(log))
    monkeypatch.setattr(OptimizerCudaGraphWrapper, "cuda_graph", FakeGraph(log))
    monkeypatch.setenv("RANK", "0")

    pretrain_gpt.shutdown()

    # both graphs were reset while the group was still alive, and then the group was destroyed
    assert log == [("reset", True), ("reset", True)]
    assert not dist.is_initialized() and not parallel_state.model_parallel_is_initialized()
    assert FullCudaGraphWrapper.cuda_graph["training"] is None and OptimizerCudaGraphWrapper.cuda_graph is None
    assert "megalab: shutdown clean cuda_graphs_released=2" in capsys.readouterr().out


def test_shutdown_without_graphs_or_groups_is_a_no_op(capsys, monkeypatch):
    from megalab.runtime import pretrain_gpt

    monkeypatch.setenv("RANK", "1")  # only rank 0 prints
    pretrain_gpt.shutdown()
    assert capsys.readouterr().out == ""
