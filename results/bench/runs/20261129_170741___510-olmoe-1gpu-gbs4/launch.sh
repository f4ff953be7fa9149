#!/usr/bin/env bash
# megalab 510-olmoe-1gpu-gbs4: one GPU, 64 experts, R0's per-GPU work (4 x 4096 tokens) in one
# micro-batch: what the experts cost without communication (1 GPU(s) on one node).
# The launcher's plan (megalab/core/plan.py) as the script that runs it: `make <target>` runs
# exactly this file under its supervisor (watchdog, GPU memory samples, run record); `bash
# /work/main/outdir/20261129_170741___510-olmoe-1gpu-gbs4/launch.sh` runs it again by hand, without
# them. Every value is quoted: none is evaluated.
set -euo pipefail

# The child environment: NCCL/CUDA settings for shared rigs (multicast over NVLink off; one
# connection keeps TP/SP communication ordered), megalab's fast-path levers (MEGALAB_FAST) and
# GPU_MEM_GB's cap (MEGALAB_GPU_MEM_GB) for the entry point, this checkout on PYTHONPATH.
export NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_MAX_CONNECTIONS=1
export PYTHONPATH=/work/main:/tmp/site
export MEGALAB_FAST=fused_adam,foreach_norm,foreach_scale,bf16_ce,addmm_bias,clip_in_adam,flat_adam,device_norm,triton_norm,grouped_gemm,moe_gather,expert_stack
export MEGALAB_GPU_MEM_GB=80

# torchrun: one process per GPU of this node; several nodes meet at the master's address and port,
# one node at a port torchrun's own store picks (--standalone).
DISTRIBUTED_ARGS=(
    --standalone --local-addr localhost --nproc_per_node 1 --nnodes 1
)

# The model: preset olmoe-like (configs/models.yaml). Attention backend auto: 'local' would swap
# megalab's spec attention back to Megatron's own; RoPE unfused: the fused one needs TE >= 1.4.
MODEL_ARGS=(
    --num-layers 16 --hidden-size 1024 --num-attention-heads 16 --seq-length 4096
    --max-position-embeddings 4096 --attention-backend auto --disable-bias-linear
)

# The catalog's batch; the reference tutorial's hyper-parameters (configs/reference/README.md).
TRAINING_ARGS=(
    --micro-batch-size 4 --global-batch-size 4 --train-iters 30 --lr 6.0e-5 --min-lr 6.0e-6
    --lr-decay-style cosine --lr-warmup-fraction .001 --weight-decay 0.1 --adam-beta1 0.9
    --adam-beta2 0.95 --init-method-std 0.006 --clip-grad 1.0 --bf16
)

# The catalog's layout. DP=1: no gradient is exchanged.
PARALLEL_ARGS=(
    --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1
)

# Mixture of experts (the preset's moe_* keys); force-balanced routing: a throughput benchmark
# without load imbalance. Grouped GEMM and permute fusion need TE: without it the first is megalab's
# grouped_gemm lever, the second is dropped (the record: substituted_flags, dropped_flags).
MOE_ARGS=(
    --num-experts 32 --moe-router-topk 4 --expert-model-parallel-size 1
    --expert-tensor-parallel-size 1 --moe-token-dispatcher-type alltoall --moe-ffn-hidden-size 1024
    --moe-router-force-load-balancing
)

# Activation recomputation, as the catalog asks (none: every activation is kept). (Nothing of this
# in this run.)
RECOMPUTE_ARGS=()

# Mock data by default: a throughput row does not depend on the text, and the tokenizer only sets
# the vocab. Real data: make prepare-data prints DATA=... TOKENIZER_MODEL=.... No [s, s] mask per
# sample from the data loader: every attention megalab runs builds the causal mask itself
# (--reset-attention-mask in EXTRA_ARGS keeps it, for document masks).
DATA_ARGS=(
    --mock-data --tokenizer-type NullTokenizer --vocab-size 50257 --split 949,50,1
    --no-create-attention-mask-in-dataloader
)

# Every iteration, with Megatron's TFLOP/s (the harness takes a median). Megatron's wandb logs only
# where TensorBoard does, and its profiler writes beside that directory.
LOGGING_ARGS=(
    --log-interval 1 --log-throughput --eval-iters 0 --eval-interval 30 --log-memory-to-tensorboard
    --log-timers-to-tensorboard
    --tensorboard-dir /work/main/outdir/20261129_170741___510-olmoe-1gpu-gbs4/tensorboard
)

# torch_dist: Megatron's sharded format, reloadable under another TP/PP. A LOAD without a checkpoint
# stops rather than train from scratch; an exit interval stops as an interrupted job would, within
# the same LR schedule. (Nothing of this in this run.)
CHECKPOINT_ARGS=()

# A torch profiler trace of two steps (RUN_DIR/torch_profile/rank-N.json.gz). (Nothing of this in
# this run.)
PROFILE_ARGS=()

# Without TE or apex: torch norms, no fused softmax; the wgrad GEMM adds into the fp32 main_grad
# only with the fused_wgrad lever; --spec: megalab's TE-free layer spec.
IMPL_ARGS=(
    --transformer-impl local --no-persist-layer-norm --no-gradient-accumulation-fusion
    --no-masked-softmax-fusion --spec megalab.runtime.spec megalab_layer_spec
)

# Full-iteration CUDA graph on, auto: predicted peak 40.9 GiB with the graph, 38.7 GiB under the
# 79.6 GiB per GPU, where auto wants 3.2 GiB to spare (one replay of forward+backward: no per-kernel
# launch cost; Megatron needs the NaN check off with it, and its rerun state machine, with nothing
# left to check, off so the host does not wait for the graph).
PERF_ARGS=(
    --cuda-graph-impl full_iteration --no-check-for-nan-in-loss-and-grad --rerun-mode disabled
)

# The target's extra_args, then EXTRA_ARGS (split once, as a shell would): last, so they win.
EXTRA_ARGS=(
    --num-experts 32 --moe-router-topk 4
)

exec torchrun "${DISTRIBUTED_ARGS[@]}" /work/main/megalab/runtime/pretrain_gpt.py \
    "${MODEL_ARGS[@]}" "${TRAINING_ARGS[@]}" "${PARALLEL_ARGS[@]}" "${MOE_ARGS[@]}" \
    "${RECOMPUTE_ARGS[@]}" "${DATA_ARGS[@]}" "${LOGGING_ARGS[@]}" "${CHECKPOINT_ARGS[@]}" \
    "${PROFILE_ARGS[@]}" "${IMPL_ARGS[@]}" "${PERF_ARGS[@]}" "${EXTRA_ARGS[@]}"
