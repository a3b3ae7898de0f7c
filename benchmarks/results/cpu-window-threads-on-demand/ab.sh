# Two trees' pipeline alone, alternating, two rounds: A=<tree before> B=<tree after> OUT=<folder> bash ab.sh
# (each tree's benchmarks.pipeline_only with the same virtual environment; PREFECT_HOME and BATCHGEN_CACHE as set;
# INFLIGHT: the jobs' windows_in_flight, 3 as on GPUs by default; SIZES: item counts)
set -eu
PY=${PY:-$B/.venv/bin/python}
INFLIGHT=${INFLIGHT:-3}
SIZES=${SIZES:-20000 200000}
for round in 1 2; do
  for tree in A B; do
    dir=${!tree}
    (cd "$dir" && "$PY" -m benchmarks.pipeline_only $SIZES --windows-in-flight "$INFLIGHT" --out "$OUT/$tree-$round") \
      > "$OUT/$tree-$round.log" 2>&1
  done
done
