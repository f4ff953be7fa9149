"""GPT pre-training on pip megatron-core 0.19 (`megatron.training`): megalab's pretrain_gpt.py.

Upstream's pretrain_gpt.py lives in the Megatron-LM repository, not in the megatron-core wheel.
This is its equivalent for GPT pre-training with mock or indexed data, on the 0.19 API:
    parse_and_validate_args -> gpt_config_from_args -> pretrain_cfg_container_from_args
    -> pretrain(cfg, datasets_provider, ModelType.encoder_or_decoder, forward_step)
The training loop, schedules, optimizer and logging are Megatron's; this file only supplies the
three callbacks (batch, loss, datasets) and two start-up fixes, each explained where it is made.

Run it through scripts/train_gpt.sh (which torchrun's it with the right flags), or set
MEGATRON_LM=/path/to/Megatron-LM to have the wrapper run upstream's own script instead.
"""
import time

_PROGRAM_START_TIME = time.time()

import os  # noqa: E402
import sys  # noqa: E402
from functools import partial  # noqa: E402

if __package__ in (None, ""):  # run as a file by torchrun: make `import megalab` work
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from megalab._compat import ensure_typing_override  # noqa: E402

ensure_typing_override()  # megatron-core 0.19 uses typing.override (3.12+); harmless on 3.12

import torch  # noqa: E402

from megalab.runtime import fastpath, levers, memcap  # noqa: E402


def _skip_helper_compilation_if_prebuilt() -> None:
    """initialize_megatron() runs `make` in megatron/core/datasets to build helpers_cpp.

    The wheel ships the compiled module but no Makefile, so that `make` fails and every run would
    exit with "Failed to compile the C++ dataset helper functions". Skip it when the module imports.
    """
    try:
        from megatron.core.datasets import helpers_cpp  # noqa: F401
    except ImportError:
        return  # a source checkout: let Megatron compile it as usual
    import megatron.core.datasets.utils as ds_utils

    ds_utils.compile_helpers = lambda: None


def get_batch(data_iterator, vp_stage=None):
    """One micro-batch, broadcast over TP and sliced for CP, as Megatron's own dummy step does."""
    from megatron.core import parallel_state as mpu
    from megatron.core.utils import get_batch_on_this_cp_rank, get_batch_on_this_tp_rank
    from megatron.training import get_args
    from megatron.training.utils import is_first_or_last_pipeline_stage

    if not is_first_or_last_pipeline_stage(vp_stage):
        return None, None, None, None, None  # middle pipeline stages receive activations instead
    args = get_args()
    tp_rank = mpu.get_tensor_model_parallel_rank()
    batch = {}
    if tp_rank == 0:
        batch = next(data_iterator)
        batch = {k: (v.cuda(non_blocking=True) if isinstance(v, torch.Tensor) else v)
                 for k, v in batch.items()}
    batch = get_batch_on_this_tp_rank(
        batch,
        has_cu_seqlens=False,
        is_hybrid_cp=False,
        create_attention_mask_in_dataloader=args.create_attention_mask_in_dataloader,
        broadcast_src_rank=mpu.get_tensor_model_parallel_src_rank(),
        broadcast_group=mpu.get_tensor_model_parallel_group(),
        cp_size=args.context_parallel_size,
        tp_rank=tp_rank,
        micro_batch_size=args.micro_batch_size,
        seq_length=args.seq_length,
        mtp_on_this_rank=False,
        pipeline_model_parallel_size=args.pipeline_model_parallel_size,
        is_pipeline_first_stage=mpu.is_pipeline_first_stage(ignore_virtual=vp_stage is None, vp_stage=vp_stage),
        is_pipeline_last_stage=mpu.is_pipeline_last_stage(ignore_virtual=vp_stage is None, vp_stage=vp_stage),
    )
    batch = get_batch_on_this_cp_rank(batch, is_hybrid_cp=False, cp_group=mpu.get_context_parallel_group())
    return (batch.get("tokens"), batch.get("labels"), batch.get("loss_mask"),
            batch.get("attention_mask"), batch.get("position_ids"))


def loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor):
    """Sum of token losses and the token count; Megatron divides and averages across DP."""
    losses = output_tensor.view(-1).float()
    loss_mask = loss_mask.view(-1).float()
    loss = torch.sum(losses * loss_mask)
    num_tokens = loss_mask.sum().clone().detach().to(torch.int)
    report = {"lm loss": torch.cat([loss.clone().detach().view(1), num_tokens.view(1)])}
    return loss, num_tokens, report


def forward_step(data_iterator, model):
    from megatron.core.utils import get_attr_wrapped_model
    from megatron.training import get_timers

    from megatron.training import get_args

    memcap.step(getattr(get_args(), "curr_iteration", 0))  # NCCL's buffers appear in the first iterations
    timers = get_timers()
    timers("batch-generator", log_level=2).start()
    vp_stage = get_attr_wrapped_model(model, "vp_stage")
    tokens, labels, loss_mask, attention_mask, position_ids = get_batch(data_iterator, vp_stage)
    timers("batch-generator").stop()
    output_tensor = model(tokens, position_ids, attention_mask, labels=labels, loss_mask=loss_mask)
    return output_tensor, partial(loss_func, loss_mask)


def _dataset_config(args):
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig
    from megatron.training import get_tokenizer
    from megatron.training.utils import get_blend_and_blend_per_split

    tokenizer = get_tokenizer()  # built by Megatron from --tokenizer-type at start-up
    blend, blend_per_split = get_blend_and_blend_per_split(args)
    return GPTDatasetConfig(
        random_seed=args.seed,
        sequence_length=args.seq_length,
        blend=blend,
        blend_per_split=blend_per_split,
        split=args.split,
        num_dataset_builder_threads=args.num_dataset_builder_threads,
        path_to_cache=args.data_cache_path,
        mmap_bin_files=args.mmap_bin_files,
        tokenizer=tokenizer,
        reset_position_ids=args.reset_position_ids,
        reset_attention_mask=args.reset_attention_mask,
        eod_mask_loss=args.eod_mask_loss,
        create_attention_mask=args.create_attention_mask_in_dataloader,
    )


def train_valid_test_datasets_provider(train_val_test_num_samples, vp_stage=None):
    from megatron.core import parallel_state as mpu
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, MockGPTDataset
    from megatron.training import get_args, print_rank_0
    from megatron.training.utils import is_first_or_last_pipeline_stage

    args = get_args()
    dataset_type = MockGPTDataset if args.mock_data else GPTDataset

    def built_on_this_rank():  # only ranks that consume data build it; TP rank 0 broadcasts
        return is_first_or_last_pipeline_stage(vp_stage) and mpu.get_tensor_model_parallel_rank() == 0

    print_rank_0(f"> building {dataset_type.__name__} train/valid/test datasets ...")
    datasets = BlendedMegatronDatasetBuilder(
        dataset_type, train_val_test_num_samples, built_on_this_rank, _dataset_config(args)).build()
    print_rank_0("> finished creating GPT datasets ...")
    return datasets


train_valid_test_datasets_provider.is_distributed = True


def _report_implementation(args, fast: list[str]) -> None:
    """One line the log parser and the run record read: which transformer path really ran."""
    if int(os.environ.get("RANK", 0)) != 0:
        return
    spec = ".".join(args.spec) if args.spec else "megatron-default"
    te = "absent"
    try:
        import transformer_engine  # noqa: F401

        te = getattr(transformer_engine, "__version__", "present")
    except Exception:
        pass
    # Whose context parallelism ran: Megatron's lives in TE's attention, megalab's in cp_attention.py.
    cp = "none"
    if args.context_parallel_size > 1:
        by = "te" if args.transformer_impl == "transformer_engine" else "megalab"
        cp = f"{by}-{'+'.join(dict.fromkeys(args.cp_comm_type))}"
    # Whose MoE experts run: TE's grouped GEMM, megalab's GroupedMLP (torch._grouped_mm: the spec
    # builds it when MEGALAB_FAST has grouped_gemm, megalab/runtime/grouped_experts.py), or SequentialMLP.
    experts = "none"
    if args.num_experts:
        experts = "sequential"
        if args.transformer_impl == "transformer_engine":
            experts = "te_grouped_gemm" if args.moe_grouped_gemm else experts
        elif spec == "megalab.runtime.spec.megalab_layer_spec":
            from megalab.runtime import grouped_experts

            experts = "megalab_grouped_mm" if grouped_experts.wanted(args.moe_grouped_gemm) else experts
    print(f"megalab: transformer_impl={args.transformer_impl} spec={spec} transformer_engine={te} "
          f"fastpath={levers.text(fast)} cp={cp} moe_experts={experts}", flush=True)


def main() -> None:
    import faulthandler
    import signal

    # `kill -USR1 <worker pid>` prints every thread's Python stack into the log: how a hang is read.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    from megatron.core.enums import ModelType
    from megatron.training import pretrain, set_startup_timestamps
    from megatron.training.argument_utils import gpt_config_from_args, pretrain_cfg_container_from_args
    from megatron.training.arguments import parse_and_validate_args

    set_startup_timestamps(program_start=_PROGRAM_START_TIME, main_entry=time.time())
    _skip_helper_compilation_if_prebuilt()
    memcap.install()  # GPU_MEM_GB: an 80 GB card on a bigger one (megalab/runtime/memcap.py)
    # the launcher's levers (MEGALAB_FAST, parsed once here), installed (megalab/runtime/levers.py)
    fast = fastpath.apply(levers.parse(os.environ.get("MEGALAB_FAST", "")))

    args = parse_and_validate_args()
    if args.spec and args.spec[0] != "local":
        # Megatron's import_module() logs and returns None on an ImportError, which would silently
        # fall back to its default spec. Import it here so a broken spec fails loudly.
        import importlib

        getattr(importlib.import_module(args.spec[0]), args.spec[1])
    _report_implementation(args, fast)

    cfg = pretrain_cfg_container_from_args(args, model_cfg=gpt_config_from_args(args))
    pretrain(cfg, train_valid_test_datasets_provider, ModelType.encoder_or_decoder, forward_step)
    shutdown()


def _captured_graphs() -> list:
    """Megatron's full-iteration CUDA graphs still alive (class attributes of its two wrappers)."""
    graphs = []
    try:
        from megatron.core.full_cuda_graph import FullCudaGraphWrapper

        for stage, graph in FullCudaGraphWrapper.cuda_graph.items():
            if graph is not None:
                graphs.append(graph)
            FullCudaGraphWrapper.cuda_graph[stage] = None
            FullCudaGraphWrapper.result[stage] = None
    except ImportError:
        pass
    try:
        from megatron.core.optimizer.optimizer_cuda_graph import OptimizerCudaGraphWrapper

        if OptimizerCudaGraphWrapper.cuda_graph is not None:
            graphs.append(OptimizerCudaGraphWrapper.cuda_graph)
        OptimizerCudaGraphWrapper.cuda_graph = None
        OptimizerCudaGraphWrapper.result = None
    except ImportError:
        pass
    return graphs


def shutdown() -> None:
    """End the run in order: CUDA graphs first, then the NCCL process groups.

    Megatron's pretrain() returns with its process groups alive and leaves them to the interpreter's
    exit. A full-iteration CUDA graph (CUDA_GRAPH=1) that captured NCCL collectives keeps those
    communicators in use, so when the groups are torn down at exit with the graph still alive,
    ncclCommDestroy waits forever (pytorch/pytorch#115388): the multi-GPU CUDA-graph runs trained
    every iteration, warned "destroy_process_group() was not called" and hung. Resetting the graphs,
    then destroying the groups explicitly, is the order NCCL needs; single-GPU runs capture no
    collective, which is why they always exited.
    """
    import torch.distributed as dist

    graphs = _captured_graphs()
    for graph in graphs:
        graph.reset()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    if dist.is_initialized():
        from megatron.core import parallel_state

        dist.barrier()
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
    if int(os.environ.get("RANK", 0)) == 0:
        print(f"megalab: shutdown clean cuda_graphs_released={len(graphs)}", flush=True)


if __name__ == "__main__":
    main()
