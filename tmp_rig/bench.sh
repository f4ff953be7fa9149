#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 MEGALAB_COMMIT=$COMMIT
python3 -m megalab.bench run --budget-s ${BUDGET:-470} ${PARTS:+--parts $PARTS} > /tmp/bench-console.txt 2>&1; echo "bench rc=$?"
grep -E "^bench:|^result" /tmp/bench-console.txt | cut -c1-220
tail -3 /tmp/bench-console.txt
cp /tmp/bench-console.txt results/bench/
tar czf $OUT/bench.tgz results/bench
