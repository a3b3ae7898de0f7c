# Two trees' pipeline alone, alternating A, B, two rounds: A=<tree before> B=<tree after> OUT=<folder> bash ab.sh
# (the same virtual environment and the same benchmark code in both trees: B's benchmarks/pipeline_only.py and
# report.py copied into A; SIZES: item counts; FLIGHT: --windows-in-flight, empty for the flow's own (1 on a CPU
# build); EXTRA: more flags, e.g. "--stop-percent 90")
set -eu
PY=${PY:-$B/.venv/bin/python}
SIZES=${SIZES:-20000 200000}
shape=${FLIGHT:+--windows-in-flight $FLIGHT}
for round in 1 2; do
  for tree in A B; do
    dir=${!tree}
    (cd "$dir" && "$PY" -m benchmarks.pipeline_only $SIZES $shape ${EXTRA:-} --out "$OUT/$tree-${FLIGHT:-own}-$round") \
      > "$OUT/$tree-${FLIGHT:-own}-$round.log" 2>&1
  done
done
