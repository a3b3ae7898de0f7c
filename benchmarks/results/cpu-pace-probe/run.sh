#!/usr/bin/env bash
# The same benchmark twice on this machine: alone, then with hog.py's rising load started when the first measured
# method starts. Run from the repository root with the project's environment active.
set -u
OUT=${OUT:-benchmarks/results/cpu-pace-probe}
ARGS=(--sizes 256 --max-tokens 16 --repeats 2 --pace-probe 64 --hf-items 0 --serial-items 4 --retry-items 4)
python -m benchmarks.run "${ARGS[@]}" --out "$OUT/alone" > "$OUT/alone.log" 2>&1
echo "alone: exit $?"
python -m benchmarks.run "${ARGS[@]}" --out "$OUT/drift" > "$OUT/drift.log" 2>&1 &
bench=$!
until grep -q "(b) raw vLLM, one call on" "$OUT/drift.log" 2>/dev/null; do
  kill -0 $bench 2>/dev/null || { wait $bench; echo "drift: exit $? before its first measured method"; exit 1; }
  sleep 0.2
done
python benchmarks/results/cpu-pace-probe/hog.py "${RAMP:-90}" "${TOP:-0.9}" &
hog=$!
wait $bench
echo "drift: exit $?"
kill $hog; pkill -f cpu-pace-probe/hog.py || true
