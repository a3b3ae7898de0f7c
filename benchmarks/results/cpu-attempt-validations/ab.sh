set -eu
cd /work/main
PY=/work/main/.venv/bin/python
export PREFECT_HOME=/work/main/.prefect BATCHGEN_CACHE=/work/main/.cache
for round in ${ROUNDS:-1 2 3}; do
  for tree in A B; do
    if [ $tree = A ]; then dir=/tmp/treeA; else dir=/work/main; fi
    (cd "$dir" && "$PY" -m benchmarks.pipeline_only 20000 --windows-in-flight 3 --stop-percent 90 --retries --out "/tmp/ab1/$tree-$round") > "/tmp/ab1/$tree-$round.log" 2>&1
  done
done
echo done > /tmp/ab1/finished
