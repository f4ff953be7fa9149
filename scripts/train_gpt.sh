#!/usr/bin/env bash
# megalab's one launcher: GPT pre-training on Megatron-Core, one torchrun per node.
#
# Flags are grouped by concern in named arrays, as in Megatron-LM's examples/. Every number comes
# from the environment. This is the readable view of a run: `python -m megalab run TARGET` builds
# the same argv in Python (megalab/core/plan.py, same array names) and runs it directly;
# tests/test_plan.py checks, for every catalog target, that this script builds exactly that argv.
# You can call it by hand:
#   NUM_LAYERS=48 HIDDEN_SIZE=1600 NUM_HEADS=25 SEQ_LEN=1024 GBS=1 MBS=1 DRY_RUN=1 scripts/train_gpt.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# ---- model (configs/models.yaml) ----------------------------------------------------------------
: "${NUM_LAYERS:?set NUM_LAYERS}" "${HIDDEN_SIZE:?set HIDDEN_SIZE}" "${NUM_HEADS:?set NUM_HEADS}"
: "${SEQ_LEN:?set SEQ_LEN}" "${GBS:?set GBS}" "${MBS:?set MBS}"
MAX_POS=${MAX_POS:-$SEQ_LEN}
VOCAB_SIZE=${VOCAB_SIZE:-50257}
FFN_HIDDEN=${FFN_HIDDEN:-}               # empty: Megatron's 4 x hidden
DISABLE_BIAS_LINEAR=${DISABLE_BIAS_LINEAR:-0}
# Modern decoders (Llama-style): RMSNorm, SwiGLU, rotary positions, grouped-query attention, untied output.
NORMALIZATION=${NORMALIZATION:-LayerNorm}   # LayerNorm | RMSNorm
SWIGLU=${SWIGLU:-0}
POS_EMB=${POS_EMB:-learned_absolute}        # learned_absolute | rope
ROTARY_BASE=${ROTARY_BASE:-}                # empty: Megatron's 10000
NUM_QUERY_GROUPS=${NUM_QUERY_GROUPS:-}      # empty: one K/V head per query head (no GQA)
UNTIE=${UNTIE:-0}
ITERS=${ITERS:-100}

# ---- parallel layout (the catalog's numbers) ----------------------------------------------------
TP=${TP:-1}; PP=${PP:-1}; CP=${CP:-1}; EP=${EP:-1}; ETP=${ETP:-1}
SP=${SP:-0}; ZERO2=${ZERO2:-0}; RECOMPUTE=${RECOMPUTE:-none}
VPP_LAYERS=${VPP_LAYERS:-}; CP_COMM=${CP_COMM:-p2p}
NUM_EXPERTS=${NUM_EXPERTS:-}; TOPK=${TOPK:-}

# ---- mixture of experts (the preset's moe_* keys; used only when NUM_EXPERTS is set) -------------
MOE_FFN_HIDDEN=${MOE_FFN_HIDDEN:-}; MOE_DISPATCHER=${MOE_DISPATCHER:-alltoall}
MOE_FORCE_BALANCE=${MOE_FORCE_BALANCE:-0}
# Transformer Engine kernels: the launcher sets these to 0 without TE. Grouped GEMM then comes from
# megalab's spec instead (grouped_gemm in MEGALAB_FAST, megalab/runtime/grouped_experts.py); the run record
# lists it under config.substituted_flags, and permute fusion under config.dropped_flags.
MOE_GROUPED_GEMM=${MOE_GROUPED_GEMM:-0}; MOE_PERMUTE_FUSION=${MOE_PERMUTE_FUSION:-0}

# ---- speed (megalab/runtime/fastpath.py patches come in MEGALAB_FAST; the launcher sets them) ------------
CUDA_GRAPH=${CUDA_GRAPH:-0}             # 1: Megatron's full-iteration CUDA graph of forward+backward

# ---- logging ---------------------------------------------------------------------------------------
TIMING_LOG_LEVEL=${TIMING_LOG_LEVEL:-0}  # 2: per-microbatch forward/backward timers (profile-* targets)
SAVE=${SAVE:-0}; LOAD=${LOAD:-}; WANDB=${WANDB:-0}; PROFILE=${PROFILE:-0}
# Where checkpoints, wandb files and profiler traces go: the run directory (`python -m megalab run`
# sets RUN_DIR; a dry run shows the placeholder).
OUT_DIR=${RUN_DIR:-RUN_DIR}

# ---- launch (single node by default; set NNODES/NODE_RANK/MASTER_ADDR for more) ------------------
GPUS_PER_NODE=${GPUS_PER_NODE:-1}
NNODES=${NNODES:-1}; NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}; MASTER_PORT=${MASTER_PORT:-6000}
DP=$(( GPUS_PER_NODE * NNODES / (TP * PP * CP) ))

# TE_IMPL: transformer_engine when TE imports (the launcher checks), else local + megalab's spec.
TE_IMPL=${TE_IMPL:-local}
SPEC=${SPEC:-megalab}          # megalab | local (Megatron's stock local spec, for comparison)

DISTRIBUTED_ARGS=(
    --nproc_per_node "$GPUS_PER_NODE" --nnodes "$NNODES" --node_rank "$NODE_RANK"
    --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT"
)

MODEL_ARGS=(
    --num-layers "$NUM_LAYERS" --hidden-size "$HIDDEN_SIZE" --num-attention-heads "$NUM_HEADS"
    --seq-length "$SEQ_LEN" --max-position-embeddings "$MAX_POS"
    --attention-backend auto   # 'local' would swap any --spec attention back to Megatron's own
)
[ -n "$FFN_HIDDEN" ] && MODEL_ARGS+=(--ffn-hidden-size "$FFN_HIDDEN")
[ "$DISABLE_BIAS_LINEAR" = 1 ] && MODEL_ARGS+=(--disable-bias-linear)
[ "$NORMALIZATION" != LayerNorm ] && MODEL_ARGS+=(--normalization "$NORMALIZATION")
[ "$SWIGLU" = 1 ] && MODEL_ARGS+=(--swiglu)
# Megatron's fused RoPE needs TE >= 1.4 ("apply_rope_fusion is not available"): always unfused here.
[ "$POS_EMB" = rope ] && MODEL_ARGS+=(--position-embedding-type rope --no-rope-fusion)
[ "$POS_EMB" = rope ] && [ -n "$ROTARY_BASE" ] && MODEL_ARGS+=(--rotary-base "$ROTARY_BASE")
[ -n "$NUM_QUERY_GROUPS" ] && MODEL_ARGS+=(--group-query-attention --num-query-groups "$NUM_QUERY_GROUPS")
[ "$UNTIE" = 1 ] && MODEL_ARGS+=(--untie-embeddings-and-output-weights)

# The reference tutorial's hyper-parameters (configs/reference/README.md).
TRAINING_ARGS=(
    --micro-batch-size "$MBS" --global-batch-size "$GBS" --train-iters "$ITERS"
    --lr 6.0e-5 --min-lr 6.0e-6 --lr-decay-style cosine --lr-warmup-fraction .001
    --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --init-method-std 0.006
    --clip-grad 1.0 --bf16
)

PARALLEL_ARGS=(
    --tensor-model-parallel-size "$TP" --pipeline-model-parallel-size "$PP"
)
[ "$CP" -gt 1 ] && PARALLEL_ARGS+=(--context-parallel-size "$CP" --cp-comm-type "$CP_COMM")
[ -n "$VPP_LAYERS" ] && PARALLEL_ARGS+=(--num-layers-per-virtual-pipeline-stage "$VPP_LAYERS")
[ "$SP" = 1 ] && PARALLEL_ARGS+=(--sequence-parallel)
# DP > 1: overlap the gradient all-reduce (reduce-scatter under ZeRO-2) with the backward pass.
[ "$DP" -gt 1 ] && PARALLEL_ARGS+=(--overlap-grad-reduce)
# ZeRO-2 = Megatron's distributed optimizer: fp32 master weights, Adam state and grads sharded over DP.
[ "$ZERO2" = 1 ] && PARALLEL_ARGS+=(--use-distributed-optimizer)
[ "$ZERO2" = 1 ] && [ "$DP" -gt 1 ] && PARALLEL_ARGS+=(--overlap-param-gather)

MOE_ARGS=()
if [ -n "$NUM_EXPERTS" ]; then
    MOE_ARGS=(--num-experts "$NUM_EXPERTS" --moe-router-topk "${TOPK:?set TOPK with NUM_EXPERTS}"
              --expert-model-parallel-size "$EP" --expert-tensor-parallel-size "$ETP"
              --moe-token-dispatcher-type "$MOE_DISPATCHER")
    [ -n "$MOE_FFN_HIDDEN" ] && MOE_ARGS+=(--moe-ffn-hidden-size "$MOE_FFN_HIDDEN")
    # Route tokens uniformly at random: a throughput benchmark without load imbalance.
    [ "$MOE_FORCE_BALANCE" = 1 ] && MOE_ARGS+=(--moe-router-force-load-balancing)
    [ "$MOE_GROUPED_GEMM" = 1 ] && MOE_ARGS+=(--moe-grouped-gemm)
    [ "$MOE_PERMUTE_FUSION" = 1 ] && MOE_ARGS+=(--moe-permute-fusion)
fi

RECOMPUTE_ARGS=()
case "$RECOMPUTE" in
    none) ;;
    selective) RECOMPUTE_ARGS=(--recompute-granularity selective) ;;
    full-*-*) IFS=- read -r _ method layers <<<"$RECOMPUTE"
              RECOMPUTE_ARGS=(--recompute-granularity full --recompute-method "$method"
                              --recompute-num-layers "$layers") ;;
    *) echo "train_gpt.sh: unknown RECOMPUTE=$RECOMPUTE (none|selective|full-uniform-N|full-block-N)" >&2; exit 2 ;;
esac

# Mock data by default: throughput rows do not depend on the text. The tokenizer only sets the vocab.
# Real data: `make prepare-data` prints DATA=<prefix>_text_document TOKENIZER_MODEL=<folder> [SPLIT=...].
DATA=${DATA:-mock}
SPLIT=${SPLIT:-949,50,1}   # Megatron 0.19 hangs building an empty split: prepare-data says when to change it
if [ "$DATA" = mock ]; then
    DATA_ARGS=(--mock-data --tokenizer-type NullTokenizer --vocab-size "$VOCAB_SIZE" --split "$SPLIT")
else
    if [ "${DRY_RUN:-0}" != 1 ] && [ ! -f "$DATA.idx" ]; then
        echo "train_gpt.sh: $DATA.idx not found; fix: make prepare-data (it prints DATA=...)" >&2; exit 2
    fi
    if [ -n "${TOKENIZER_MODEL:-}" ]; then   # the tokenizer folder saved beside the data: offline, exact
        DATA_ARGS=(--data-path "$DATA" --tokenizer-type HuggingFaceTokenizer
                   --tokenizer-model "$TOKENIZER_MODEL" --split "$SPLIT")
    else  # mcore 0.19's GPT2BPETokenizer loads the Hub's `gpt2` (its tokenizer.json): GPT-2 itself, online only
        DATA_ARGS=(--data-path "$DATA" --tokenizer-type GPT2BPETokenizer
                   --vocab-file "${VOCAB_FILE:?set TOKENIZER_MODEL (or VOCAB_FILE+MERGE_FILE) for DATA=$DATA}"
                   --merge-file "${MERGE_FILE:?set MERGE_FILE for DATA=$DATA}" --split "$SPLIT")
    fi
fi

# Log every iteration (the harness takes a median) with Megatron's own TFLOP/s estimate.
LOGGING_ARGS=(
    --log-interval 1 --log-throughput --eval-iters 0 --eval-interval "$ITERS"
    --log-memory-to-tensorboard --log-timers-to-tensorboard
)
# Megatron's wandb logs only where TensorBoard does, and its profiler writes beside that directory.
if [ -n "${RUN_DIR:-}" ] || [ "$WANDB" = 1 ] || [ "$PROFILE" = 1 ]; then
    LOGGING_ARGS+=(--tensorboard-dir "$OUT_DIR/tensorboard")
fi
[ "$TIMING_LOG_LEVEL" -gt 0 ] && LOGGING_ARGS+=(--timing-log-level "$TIMING_LOG_LEVEL")
if [ "$WANDB" = 1 ]; then
    LOGGING_ARGS+=(--wandb-project "${WANDB_PROJECT:-megalab}" --wandb-exp-name "$(basename "$OUT_DIR")"
                   --wandb-save-dir "$OUT_DIR/wandb")
    [ -n "${WANDB_ENTITY:-}" ] && LOGGING_ARGS+=(--wandb-entity "$WANDB_ENTITY")
    # No API key: log offline into the run dir (`wandb sync` uploads it later), never prompt.
    [ -z "${WANDB_API_KEY:-}" ] && export WANDB_MODE=${WANDB_MODE:-offline}
fi

# ---- checkpoints: SAVE=1 writes RUN_DIR/checkpoints, LOAD=<dir> resumes from one -----------------
# torch_dist is Megatron's sharded format (each rank writes its shard; reloadable under another
# TP/PP). Resuming restores weights, optimizer, RNG and the iteration count; the data loader skips
# the samples already consumed. A LOAD without a checkpoint stops instead of training from scratch.
CHECKPOINT_ARGS=()
[ "$SAVE" = 1 ] && CHECKPOINT_ARGS+=(--save "$OUT_DIR/checkpoints" --save-interval "${SAVE_INTERVAL:-$ITERS}")
[ -n "$LOAD" ] && CHECKPOINT_ARGS+=(--load "$LOAD" --exit-on-missing-checkpoint)
[ "${#CHECKPOINT_ARGS[@]}" -gt 0 ] && CHECKPOINT_ARGS+=(--ckpt-format torch_dist)
# Stop at this iteration as an interrupted job would (resume-* targets): the LR schedule still
# spans ITERS, so the resumed run continues the very same schedule.
[ -n "${EXIT_INTERVAL:-}" ] && CHECKPOINT_ARGS+=(--exit-interval "$EXIT_INTERVAL")

# ---- PROFILE=1: a torch profiler trace of two steps (Megatron writes RUN_DIR/torch_profile/rank-N.json.gz)
PROFILE_ARGS=()
if [ "$PROFILE" = 1 ]; then
    PROFILE_START=${PROFILE_START:-10}   # Megatron's default; the launcher moves it for ITERS < 12
    PROFILE_ARGS=(--profile --use-pytorch-profiler --profile-step-start "$PROFILE_START"
                  --profile-step-end "$(( PROFILE_START + 2 ))")
fi

if [ "$TE_IMPL" = transformer_engine ]; then
    IMPL_ARGS=(--transformer-impl transformer_engine)
else
    # Without TE/apex: torch norms, no fused softmax. The wgrad GEMM adds into the fp32 main_grad only
    # with the fused_wgrad lever (megalab/runtime/fastpath.py stands in for apex's kernel).
    IMPL_ARGS=(--transformer-impl local --no-persist-layer-norm)
    [[ ",${MEGALAB_FAST:-}," == *,fused_wgrad,* ]] || IMPL_ARGS+=(--no-gradient-accumulation-fusion)
    IMPL_ARGS+=(--no-masked-softmax-fusion)
    [ "$SPEC" = megalab ] && IMPL_ARGS+=(--spec megalab.runtime.spec megalab_layer_spec)
fi

# One CUDA graph replays the whole forward+backward: no per-kernel launch cost, which is most of
# a small-batch step without TE's fused kernels. Megatron requires the NaN check off with it.
PERF_ARGS=()
[ "$CUDA_GRAPH" = 1 ] && PERF_ARGS+=(--cuda-graph-impl full_iteration --no-check-for-nan-in-loss-and-grad)

# EXTRA_ARGS is a shell word list ('--seed 7 --data-cache-path "/a b"'): Python's shlex splits it,
# exactly as the launcher does, into argv items. Never eval: a value is data, not code.
EXTRA=()
if [ -n "${EXTRA_ARGS:-}" ]; then
    mapfile -d '' -t EXTRA < <("${PYTHON:-python3}" -c \
        'import shlex, sys; sys.stdout.write("".join(a + "\0" for a in shlex.split(sys.argv[1])))' "$EXTRA_ARGS")
fi

if [ -n "${MEGATRON_LM:-}" ]; then
    ENTRY=("$MEGATRON_LM/pretrain_gpt.py")      # upstream's own entry point, same flags
else
    ENTRY=("$ROOT/megalab/runtime/pretrain_gpt.py")
fi

# Multicast over NVLink stays off (shared rigs); 1 connection keeps TP/SP comm ordered for Megatron.
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
export NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1} CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}
export PYTHONPATH="$ROOT${MEGATRON_LM:+:$MEGATRON_LM}${PYTHONPATH:+:$PYTHONPATH}"

CMD=(torchrun "${DISTRIBUTED_ARGS[@]}" "${ENTRY[@]}"
     "${MODEL_ARGS[@]}" "${TRAINING_ARGS[@]}" "${PARALLEL_ARGS[@]}" "${MOE_ARGS[@]}"
     "${RECOMPUTE_ARGS[@]}" "${DATA_ARGS[@]}" "${LOGGING_ARGS[@]}" "${CHECKPOINT_ARGS[@]}"
     "${PROFILE_ARGS[@]}" "${IMPL_ARGS[@]}" "${PERF_ARGS[@]}" "${EXTRA[@]}")

if [ "${DRY_RUN:-0}" = 1 ]; then
    printf '%q ' "${CMD[@]}"; echo
    exit 0
fi
exec "${CMD[@]}"
