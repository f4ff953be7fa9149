#!/usr/bin/env bash
# GPT pre-training on Megatron-Core for one catalog target: one torchrun on this node.
#
# No Megatron flag is written here. `python -m megalab script TARGET` renders the target's run plan
# (megalab/core/plan.py) as the bash script `make TARGET` writes into its run directory and runs
# (RUN_DIR/launch.sh: the child environment, the flags in named arrays by concern as in Megatron-LM's
# examples/, then `exec torchrun`); this wrapper runs that script, or prints it with DRY_RUN=1. The
# make variables apply as for `make TARGET` (ITERS, GPU_MEM_GB, EXTRA_ARGS, NNODES, ...: `make help`);
# RUN_DIR names the directory its checkpoints, TensorBoard and traces go to. Unlike `make TARGET` it
# keeps no record: no preflight, no GPU memory samples, no run.json.
#   DRY_RUN=1 scripts/train_gpt.sh 101        # print the script
#   ITERS=20 scripts/train_gpt.sh 101         # run it
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: scripts/train_gpt.sh TARGET  (DRY_RUN=1 prints the launch script; make list shows targets)" >&2
    exit 2
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
script=$(PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "${PY:-python3}" -m megalab script "$1" \
         ${RUN_DIR:+--run-dir "$RUN_DIR"})
dry_run=${DRY_RUN:-0}
case "${dry_run,,}" in
    1|true|yes|on) printf '%s\n' "$script" ;;
    *) exec bash -c "$script" "$1" ;;
esac
