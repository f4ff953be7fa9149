#!/bin/bash
# diagnostic: where does gpt2-xl's step time go on the TE-free path (1x H100)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 MEGALAB_COMMIT=$COMMIT OUTDIR=/tmp/outdir ITERS=20
mkdir -p $OUTDIR
r() { id=$1; tag=$2; shift 2; env "$@" make $id > $OUTDIR/console-$tag.txt 2>&1; echo "== $tag rc=$?"; grep -E "^result|^megalab:" $OUTDIR/console-$tag.txt | cut -c1-300; grep -E "forward-backward|optimizer \.|optimizer-inner|optimizer-clip|optimizer-copy|elapsed time per iteration" $OUTDIR/console-$tag.txt | tail -9 | cut -c1-200; }
python3 -m megalab.bench matmul
PROF="--profile --use-pytorch-profiler --profile-step-start 12 --profile-step-end 14"
T2="--timing-log-level 2"
ALL=fused_adam,foreach_norm,foreach_scale,cudnn_sdpa
r 101-gpt2xl-dp1-gbs1-bf16 a101-none  EXTRA_ARGS="$T2"
r 101-gpt2xl-dp1-gbs1-bf16 b101-all   MEGALAB_FAST=$ALL EXTRA_ARGS="$T2"
r 101-gpt2xl-dp1-gbs1-bf16 c101-prof  MEGALAB_FAST=$ALL EXTRA_ARGS="$PROF"
for f in $OUTDIR/*/torch_profile/rank-0.json.gz; do echo "TRACE $f"; python3 -m megalab.bench trace $f | head -30; done
r 101-gpt2xl-dp1-gbs1-bf16 d101-graph MEGALAB_FAST=$ALL EXTRA_ARGS="--cuda-graph-impl full_iteration --no-check-for-nan-in-loss-and-grad"
tail -30 $OUTDIR/console-d101-graph.txt | cut -c1-250
r 111-gpt2xl-dp1-fit-80GB e111-all    MEGALAB_FAST=$ALL EXTRA_ARGS="$T2"
r 111-gpt2xl-dp1-fit-80GB f111-nocudnn MEGALAB_FAST=fused_adam,foreach_norm,foreach_scale
r 111-gpt2xl-dp1-fit-80GB g111-prof   MEGALAB_FAST=$ALL EXTRA_ARGS="$PROF"
for f in $(ls $OUTDIR/*111*/torch_profile/rank-0.json.gz); do echo "TRACE $f"; python3 -m megalab.bench trace $f | head -30; done
rm -rf $OUTDIR/*/torch_profile
cd /tmp && tar czf $OUT/diag.tgz outdir
