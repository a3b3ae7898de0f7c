#!/bin/bash
# A = the tree before (7b433a6, .xfer/old), B = 593796a: pipeline_only with retries, alternating
source /work/main/.venv/bin/activate
export PREFECT_HOME=/work/main/.prefect BATCHGEN_CACHE=/tmp/ab/cache
for round in 1 2 3 4; do
  for tree in A B; do
    dir=/work/main; [ $tree = A ] && dir=/work/main/.xfer/old
    (cd $dir && PYTHONPATH=$dir python -m benchmarks.pipeline_only 20000 --windows-in-flight 3 --stop-percent 90 --retries --out /tmp/ab/$tree-$round > /tmp/ab/$tree-$round.log 2>&1)
    echo "$tree $round exit $?" >> /tmp/ab/done
  done
done
