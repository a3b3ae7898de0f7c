# Two trees' pipeline alone, alternating, two rounds: A=<tree before> B=<tree after> OUT=<folder> bash ab.sh
# (the same virtual environment and the same benchmark code in both trees: B's benchmarks/standin.py and
# pipeline_only.py copied into A; SIZES: item counts; EXTRA: more flags, e.g. "--stop-percent 90")
set -eu
PY=${PY:-$B/.venv/bin/python}
SIZES=${SIZES:-20000 200000}
for round in 1 2; do
  for tree in A B; do
    dir=${!tree}
    (cd "$dir" && "$PY" -m benchmarks.pipeline_only $SIZES --windows-in-flight 3 ${EXTRA:-} --out "$OUT/$tree-$round") \
      > "$OUT/$tree-$round.log" 2>&1
  done
done
