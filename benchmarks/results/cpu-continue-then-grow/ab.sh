#!/bin/bash
# alternate the example job with grow and continue_then_grow on the CPU engine, one fresh process each
cd /work/main && source .venv/bin/activate && export PREFECT_HOME=/tmp/ctg/prefect BATCHGEN_CACHE=$PWD/.cache
for round in 1 2; do
  for s in grow continue_then_grow; do
    [ $round = 2 ] && s=$([ $s = grow ] && echo continue_then_grow || echo grow)
    t0=$(date +%s.%N)
    batchgen run examples/product_descriptions.yaml --set retry.strategy=$s --set output.dir=/tmp/ctg/out-$s-$round > /tmp/ctg/$s-$round.log 2>&1
    echo "$round $s exit $? wall $(echo "$(date +%s.%N) - $t0" | bc)" >> /tmp/ctg/summary.txt
  done
done
