#!/bin/bash
# Alternating pairs: a worktree of the commit before the join (A, /tmp/wt-head) and the working tree (B),
# the same virtual environment; each run a fresh process (tail_timings.py: pipeline_only's measure, 10,000 items,
# 80-token stand-in outputs, windows_in_flight 3, with timers around the publish step's parts).
for i in 1 2 3; do
  for side in A B; do
    if [ $side = A ]; then dir=/tmp/wt-head; else dir=/work/main; fi
    if [ $((i % 2)) = 0 ]; then if [ $side = A ]; then dir=/work/main; side=B; else dir=/tmp/wt-head; side=A; fi; fi
    cd $dir && PREFECT_HOME=/tmp/ph-tail BATCHGEN_CACHE=$BATCHGEN_CACHE timeout 900 python /work/main/benchmarks/results/cpu-seal-join/tail_timings.py 10000 80 \
      2>/dev/null | grep -E '^\{|^seal|^add_window|^report|^commit' | sed "s/^/$side$i /"
  done
done
