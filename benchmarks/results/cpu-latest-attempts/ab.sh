#!/bin/bash
# alternate new (working tree) and old (HEAD before the change) pipeline_only runs
source /work/main/.venv/bin/activate
export PREFECT_HOME=/work/main/.prefect BATCHGEN_CACHE=/work/main/.cache
for round in 1 2 3; do
  for way in new old; do
    if [ $(( round % 2 )) -eq 0 ]; then way=$([ $way = new ] && echo old || echo new); fi
    dir=/work/main; [ $way = old ] && dir=/tmp/ab/old
    (cd $dir && PYTHONPATH=$dir python -m benchmarks.pipeline_only 20000 --windows-in-flight 3 --stop-percent 90 --retries --out /tmp/ab/out-$way-$round > /tmp/ab/$way-$round.log 2>&1)
    python3 -c "
import json; d=json.load(open('/tmp/ab/out-$way-$round/latest.json')); s=d['sizes']['20000']
print('$way', $round, s['items_per_second'], s['cpu_seconds'], round(s['wall_seconds']-s['timings_seconds']['last_output'],2), s['published']['distinct_item_ids'])"
  done
done
