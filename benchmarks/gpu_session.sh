#!/usr/bin/env bash
# One benchmark session on a GPU machine, in about 9 minutes. Run from the repository root with the
# environment of ../shared/gpu/README.md exported (PYTHONPATH, VLLM_USE_FLASHINFER_SAMPLER=0, BATCHGEN_CACHE,
# PREFECT_HOME):
#
#   bash benchmarks/gpu_session.sh                  # results into benchmarks/results/gpu-h200 (or gpu-<device>)
#   OUT=/some/dir SESSION_SECONDS=500 bash benchmarks/gpu_session.sh
#   STEPS="run big_model pipeline" bash benchmarks/gpu_session.sh   # the steps to run (default: run big_model)
#   STEPS=paired16 ...; then STEPS=paired80, then STEPS=paired80_fcfs, each a call on the same machine
#   RUN_EXTRA="--retry-variants in_stream continue_in_stream" ...   # more arguments for the `run` step
#   RUN_EXTRA="--retry-variants in_stream_no_ahead in_stream_ahead in_stream_ahead in_stream_no_ahead" \
#     STEPS=paired80 ...                         # grow with and without retry.ahead, each twice, alternating
#   RUN_EXTRA="--retry-variants in_stream continue_then_grow_ahead_in_stream" BESIDE80=0 REPEATS=1 \
#     STEPS=paired80 ...                         # the example's continue_then_grow with and without retry.ahead
#                                               # (2026-12-06c, an H100: ~100 fewer steps, no shorter job); with
#                                               # "in_stream grow_in_stream grow_in_stream in_stream": against grow
#   RUN_EXTRA="--retry-variants in_stream to_cap_in_stream in_stream to_cap_in_stream" BESIDE80=0 REPEATS=1 \
#     STEPS=paired80 ...                         # one grow retry straight to the cap against two doublings
#                                               # (2026-12-06, a slow H100: no faster, more left cut off; with a
#                                               # cold compile cache it needs more than one call's 480 s there)
#   BESIDE16=0 BESIDE80=0 STEP_CAP=580 ...  # paired16/paired80 without the raw-beside-pipeline run, a longer cap
#                                               # (else the stand-in pipeline's ITEMS, not a switch: it must last
#                                               # through raw's call; BESIDE16=1 covered 2% of it, flagged in the
#                                               # report; defaults 50,000 and 100,000 items)
#   SIZES="10000 30000" REPEATS16=2 BESIDE16=0 STEPS=paired16 ...   # paired16/paired80 at these sizes: how the time
#                                               # beyond raw's grows with the items (a fixed part and a share)
#   SIZES="10000 20000" REPEATS=1 BESIDE80=0 RUN_EXTRA="--retry-sizes 10000 20000" STEPS=paired80 ...
#                                               # the same with the job's retries at both sizes
#   RUN_EXTRA="--windows-held-per-place 8" BESIDE80=0 STEPS=paired80 ...   # the flow holding 8 windows per place
#                                               # (also without retries): one call, then the same without it
#   RUN_EXTRA="--add-per-step 100000" BESIDE80=0 STEPS=paired80 ...   # a window's requests into the engine at once
#   SIZES=60000 REPEATS16=2 BESIDE16=0 RUN_EXTRA="--hf-items 0" STEPS=paired16 ...
#                                               # raw and the flow twice at 60,000 x 16, without HF
#   ... RUN_EXTRA="--hf-items 0 --engine-switch-interval 0.0005" STEPS=paired16 ...   # the same with Python's
#                                               # thread switch interval at 0.5 ms in the engine's process and
#                                               # vLLM's engine core (both methods): a call beside one without it
#                                               # (lease-2026-12-07g, a slow host: nothing readable)
#   STEPS=variants16 VARIANTS=switch05 SIZES=60000 REPEATS16=2 ...   # the same question in one call: the flow
#                                               # with 5 ms and with 0.5 ms (set on the running engine) in every
#                                               # repeat, beside the same raw calls
#   PROBE16=0 / PROBE80=0                       # paired16 and variants16 probe the host's pace with raw's call on
#                                               # 4,096 prompts (PROBE16) before each repeat and after every run,
#                                               # paired80 and variants80 on 1,024 (PROBE80): the paced ratios, its
#                                               # drift taken out (an H100 host's pace moved 1.8x within 11 minutes,
#                                               # benchmarks/results/gpu-h100/lease-2026-12-07/); 0: no probes.
#                                               # Each probe takes about 3-4 s on an H100: the times below are
#                                               # without them (paired80's 3 repeats: about 30 s more). With
#                                               # probes the host's CPU pace is also sampled all through the run
#                                               # (ratio_flow_vs_raw_cpu_paced, cpu_pace_fit: a host whose pace
#                                               # swings within a run, lease-2026-12-07d)
#
# Two trees on one machine (a change against the tree before it): carry the older tree as a git-ignored folder,
#   mkdir -p .xfer/old && git archive OLD_COMMIT | tar -x -C .xfer/old
#   rm -rf .xfer/old/benchmarks/results .xfer/old/tests .xfer/old/docs     # about 1 MB left: carry [".xfer/old"]
# and alternate calls run from the repository root and from it:
#   cd .xfer/old && export PYTHONPATH=/tmp/site:$PWD ... && OUT=$OUT/old RESULTS_DIR=/tmp/res-old \
#     bash benchmarks/gpu_session.sh
# (benchmarks/results/gpu-h100/lease-2026-12-05f/ ran so).
#
# Steps, each under a time limit (its cap, or what is left of SESSION_SECONDS, default 540):
# (on a fresh machine the first step spends about 225 s before its first measured run: imports, the model's GGUF
# converted, the engine built with a cold compile cache, the warm-up; benchmarks/results/gpu-h100/lease-2026-12-07b/;
# with the compile caches below carried the engine built in 58 s there, lease-2026-12-07e)
#   run        benchmarks.run: 10,000 items at max_tokens 80 and 16 with one engine; HF transformers on 256 items
#              in batches of 64; one prompt per call on 32 items; the retry strategies on 64 items; the whole job
#              with the example job's retries at 80 tokens against raw's first pass, retried in the stream, in
#              passes and by `continue` (--with-retries)
#   paired16   benchmarks.run at 10,000 items x 16 tokens, raw vLLM and the flow $REPEATS16 times (default 5) in
#              alternating order (the ratios are the medians of the pairs'), and raw once more beside the pipeline
#              stood in on 50,000 items (--beside-pipeline: how much the pipeline's work on the host slows the
#              engine), into $RES/max-tokens-16; about 6 minutes with a cold compile cache: the first call
#   paired80   the same at 80 tokens ($REPEATS pairs, default 3; beside the pipeline on 100,000 items), then the
#              whole job with its retries in the stream, into $RES; about 7.5 minutes once paired16 has warmed
#              the compile cache: a call of its own
#   paired80_fcfs  paired80 with the engine built under vLLM's default scheduling policy (fcfs: no priorities,
#              retries behind the first attempts still waiting), into $RES/fcfs: whether the priority queue costs
#              the engine anything (the lease that brought it in saw raw and the flow both slower); a call of its own
#   variants80 at 80 tokens, retries off, $REPEATS repeats (default 2) of raw vLLM and the flow as it is and in
#              each of $VARIANTS (default "add_all held8": a window's requests added at once; 8 windows held per
#              place), on one engine, into $RES/variants80: which feeding, if any, closes the flow's gap to raw at 80
#              tokens; 445 s with a cold compile cache at the defaults (each run ~30 s), a call of its own;
#              VARIANTS=add_all REPEATS=3 fits the same time; VARIANTS=full_to_end: the last windows full size,
#              not ramped down (5-24% longer on an H100: benchmarks/results/gpu-h100/lease-2026-12-06b/); with a
#              cold compile cache REPEATS=3 needs a call of its own (343 s warm)
#   variants16 at 16 tokens, retries off, on $SIZES (default 10000), $REPEATS16 repeats (default 3) of raw vLLM and
#              the flow as it is and in each of $VARIANTS (default "engine_apart own_cores": vLLM's engine core on the
#              host's last 2 cores, everything else on the rest; the engine core on the first 2 and batchgen's front
#              end on the third; "tok4": the prompts tokenized in at most 4 slices), into $RES/variants16: whether the
#              flow's work on the host's cores slows the engine (each method's CPU figures by process group beside);
#              about 6.5 minutes at 10,000 items on a slow H100 host; SIZES=60000 REPEATS16=1 VARIANTS=own_cores:
#              about 5 (benchmarks/results/gpu-h100/lease-2026-12-06e/); SIZES=60000 REPEATS16=1
#              VARIANTS="engine_only engine_apart" (engine_only: the engine core alone on the last 2 cores, the rest
#              left where it was), calls in turn with RUN_EXTRA=--reversed-first for ABBA pairs: about 6 minutes
#              each (benchmarks/results/gpu-h100/lease-2026-12-06f/: pinning did not pay); VARIANTS=stream: raw's
#              prompts through batchgen's engine stream in windows, no pipeline (the feeding's cost apart from the
#              pipeline's); RUN_EXTRA=--profile-engine-core: py-spy on vLLM's engine core during every method
#              (its time by thread and function side by side in the .md; the stacks in
#              variants16-engine-core-profiles.tgz, side by side by function in variants16-profile-compare.md
#              by python -m benchmarks.profile_compare). SIZES=60000
#              REPEATS16=1 VARIANTS=stream RUN_EXTRA=--profile-engine-core: about 5.5 minutes with the setup, 4 more
#              with --reversed-first (lease-2026-12-06g: the stream as slow as the flow); VARIANTS="stream stream_all
#              wide": whether queuing every request at the start (the stream's, the flow's) restores raw's pace.
#              VARIANTS=switch05: the flow with Python's thread switch interval at 0.5 ms where vLLM's front end
#              runs and in its engine core, set on the running engine for the flow's run (a worker extension:
#              benchmarks/switch_interval.py), beside the flow with 5 ms: whether the interpreter's lock between
#              the core's input thread and its stepping slows the flow's steps on a fast host.
#              VARIANTS=raw_load SIZES=60000 REPEATS16=2: raw's call again with about 1 core of CPU load beside
#              it (4 processes partly busy), against raw alone, paced: whether CPU work like the flow's own slows
#              the engine of a fast host through the host alone (lease-2026-12-07c: the flow's steps 11% slower
#              there while it kept 0.5-0.7 more cores busy; 4 cores of load took raw's from 29 to 37 ms)
#              RUN_EXTRA=--profile-run-process: py-spy on the run's own process the same way (the flow's CPU beside
#              the engine by thread and function, in the .md; the stacks in variants16-run-process-profiles.tgz)
#              variants80 and variants16 run no HF transformers (--hf-items 0: ~25 s a call that no figure of
#              theirs needs); each run's figures are in the step's log as it ends, so a step cut short keeps them
#   here       the same comparison at 80 and 16 tokens (HF, the loop and the retry runs on a few items only) with
#              vLLM's front end in the run's process (--front-end here), into $RES/front-end-here: the pair of `run`
#   run_batch  benchmarks.run_batch_compare: `vllm run-batch` against `batchgen run`, each a fresh process, on the
#              same 10,000 conversations at 80 tokens, into $RES/run-batch
#   run_batch_retries  the same with retries on: batchgen's job with its retries against run-batch plus one naive
#              retry pass of the cut-off outputs (--retries)
#   big_model  benchmarks.big_model: raw vLLM against the flow on an 8B-shaped model (random weights),
#              2,000 items x 128 tokens
#   profile16  the `here`-sized comparison at 16 tokens only, under py-spy (every process of the run, each thread,
#              100 samples/s, collapsed stacks into $LOGS/profile16.txt: where the flow's and the engine front end's
#              time goes); py-spy from PATH, else the payload's /tmp/site/bin/py-spy (PYSPY=/path/to/py-spy)
#   contention benchmarks.host_contention (about 40 s, first when asked): one Python thread's pace on CPU 0, then
#              on CPU 1, alone and beside a spinning process on each other CPU in turn, then (on CPU 0) beside 1, 2,
#              4, ... of them, into $RES/contention
#              (host-contention.json comes back; the table is in contention.log): whether the host's vCPUs hide
#              hyperthread siblings, and how much busy cores elsewhere slow a thread like vLLM's engine core
#   pipeline   benchmarks.pipeline_only 20000: the flow with the engine stood in (the host's cost, not the GPU's;
#              about 2 minutes more, so not by default)
#   floor      benchmarks.pipeline_floor on 20,000 items, windows of 2,048 and 8,192: what the tokenizer and
#              Prefect's task runs cost on the host, beside the pipeline alone, into $RES/pipeline-floor (about
#              2 minutes on 2 cores, not by default)
# Compile caches across leases (a fresh machine builds the engine in 72-115 s with cold caches, 32-39 s warm:
# lease-2026-12-07c; 58 s on a fresh machine with them carried, lease-2026-12-07e): WARM_OUT=1 packs vLLM's
# torch.compile cache, Inductor's and Triton's at the session's end
# into $OUT/compile-caches.tgz (one of the 8 files that come back; left out above 15 MiB, its size logged); keep it
# git-ignored here as .xfer/warm/compile-caches.tgz and carry .xfer/warm on a later lease's last setup call: a
# session finding it (WARM_IN, that path by default where nvidia-smi is: a GPU machine, not a checkout elsewhere
# whose own caches it would fill) unpacks it before its first step. Caches that do not match
# that machine's versions are simply not used (vLLM and Inductor key them by version and config).
# A step that fails or runs out of time is reported in session.log; the next step still runs. Each step's log,
# session.log and copies of latest.json, latest.md, latest.png and big_model.json go to $OUT when it is set
# (8 files, flat), else to a temporary folder whose name is printed.
set -u

PY=${PYTHON:-python3}
# py-spy for profile16 and benchmarks.run --profile-engine-core: the PATH's, else the payload's
export PYSPY=${PYSPY:-$(command -v py-spy || echo /tmp/site/bin/py-spy)}
SESSION_SECONDS=${SESSION_SECONDS:-540}
STEPS=" ${STEPS:-run big_model} "
started=$(date +%s)
LOGS=${OUT:-$(mktemp -d /tmp/batchgen-gpu-session-XXXXXX)}
mkdir -p "$LOGS"
RES=${RESULTS_DIR:-$("$PY" -m benchmarks.gpu)}
SUMMARY="$LOGS/session.log"
{
  echo "batchgen GPU session $(date -u +%FT%TZ)"
  echo "results: $RES   logs: $LOGS   budget: $SESSION_SECONDS s"
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv 2>&1
  # the host's CPUs as the VM shows them (threads per core, clock, caches): what the engine core's pace depends on
  "$PY" -c "from benchmarks.host_contention import lscpu; print(*(f'{k}: {v}' for k, v in lscpu().items()), sep='\n')"
  # the JSON-lines mirrors' writer: Polars where the payload brought it (docs/gpu.md), else the slower orjson path
  "$PY" -c "import batchgen.publish as p; print('polars writer', p._polars() is not None)" 2>&1 | tail -1
} > "$SUMMARY"

# vLLM's, Inductor's and Triton's compile caches, relative to / (as tar stores them)
compile_caches() {
  local dir
  for dir in "${VLLM_CACHE_ROOT:-$HOME/.cache/vllm}/torch_compile_cache" \
             "${TORCHINDUCTOR_CACHE_DIR:-/tmp/torchinductor_$(id -un)}" "${TRITON_CACHE_DIR:-$HOME/.triton/cache}"; do
    [ -d "$dir" ] && echo "${dir#/}"
  done
}
if [ -z "${WARM_IN:-}" ] && command -v nvidia-smi > /dev/null; then
  WARM_IN=.xfer/warm/compile-caches.tgz
fi
if [ -n "${WARM_IN:-}" ] && [ -f "$WARM_IN" ]; then
  if tar -C / -xzf "$WARM_IN" 2>> "$SUMMARY"; then
    echo "compile caches: unpacked $WARM_IN ($(du -k "$WARM_IN" | cut -f1) KB)" >> "$SUMMARY"
  else
    echo "compile caches: $WARM_IN could not be unpacked; cold caches" >> "$SUMMARY"
  fi
fi

left() { echo $(( SESSION_SECONDS - ($(date +%s) - started) )); }

step() {  # step NAME CAP_SECONDS COMMAND...: run COMMAND with its output in $LOGS/NAME.log
  local name=$1 cap=$2
  shift 2
  [[ $STEPS == *" $name "* ]] || return 0
  local limit
  limit=$(left)
  (( limit > cap )) && limit=$cap
  if (( limit < 45 )); then
    echo "$name: skipped ($(left) s of the session left)" | tee -a "$SUMMARY"
    return 0
  fi
  echo "$name: starting, limit $limit s: $*" | tee -a "$SUMMARY"
  local t0 rc
  t0=$(date +%s)
  # SIGINT first (Python unwinds and shuts the engine down), SIGKILL 20 s later; timeout signals the whole
  # process group, vLLM's engine processes included.
  timeout --signal=INT --kill-after=20 "$limit" "$@" > "$LOGS/$name.log" 2>&1
  rc=$?
  if (( rc == 0 )); then
    echo "$name: ok in $(( $(date +%s) - t0 )) s" | tee -a "$SUMMARY"
  else
    echo "$name: FAILED (exit $rc$( (( rc == 124 || rc == 137 )) && echo ', out of time')) after" \
         "$(( $(date +%s) - t0 )) s; last lines of $name.log:" | tee -a "$SUMMARY"
    tail -n 15 "$LOGS/$name.log" | sed 's/^/    /' | tee -a "$SUMMARY"
  fi
  return 0
}

step contention 120 "$PY" -m benchmarks.host_contention --timings 5 --probe-cpu 0 1 --out "$RES/contention"
step run 570 "$PY" -m benchmarks.run --sizes 10000 --max-tokens 80 16 --hf-items 256 --hf-batch-size 64 \
  --serial-items 32 --retry-items 64 --with-retries ${RUN_EXTRA:-} --out "$RES"
step paired16 "${STEP_CAP:-540}" "$PY" -m benchmarks.run --sizes ${SIZES:-10000} --max-tokens 16 \
  --repeats "${REPEATS16:-5}" --beside-pipeline "${BESIDE16:-50000}" --hf-items 32 --hf-batch-size 32 \
  --serial-items 16 --retry-items 16 --pace-probe "${PROBE16:-4096}" ${RUN_EXTRA:-} --out "$RES/max-tokens-16"
step paired80 "${STEP_CAP:-540}" "$PY" -m benchmarks.run --sizes ${SIZES:-10000} --max-tokens 80 \
  --repeats "${REPEATS:-3}" --beside-pipeline "${BESIDE80:-100000}" --hf-items 32 --hf-batch-size 32 \
  --serial-items 16 --retry-items 16 --pace-probe "${PROBE80:-1024}" \
  --with-retries --retry-variants in_stream ${RUN_EXTRA:-} --out "$RES"
step paired80_fcfs 540 "$PY" -m benchmarks.run --sizes 10000 --max-tokens 80 --repeats "${REPEATS:-3}" \
  --scheduling-policy fcfs --hf-items 32 --hf-batch-size 32 --serial-items 16 --retry-items 16 --with-retries \
  --retry-variants in_stream ${RUN_EXTRA:-} --out "$RES/fcfs"
step variants80 "${STEP_CAP:-540}" "$PY" -m benchmarks.run --sizes 10000 --max-tokens 80 --repeats "${REPEATS:-2}" \
  --flow-variants ${VARIANTS:-add_all held8} --hf-items 0 --serial-items 8 --retry-items 8 \
  --pace-probe "${PROBE80:-1024}" ${RUN_EXTRA:-} --out "$RES/variants80"
step variants16 "${STEP_CAP:-540}" "$PY" -m benchmarks.run --sizes ${SIZES:-10000} --max-tokens 16 \
  --repeats "${REPEATS16:-3}" --flow-variants ${VARIANTS:-engine_apart own_cores} --hf-items 0 \
  --serial-items 8 --retry-items 8 --pace-probe "${PROBE16:-4096}" ${RUN_EXTRA:-} --out "$RES/variants16"
step here 420 "$PY" -m benchmarks.run --front-end here --sizes 10000 --max-tokens 80 16 --hf-items 8 \
  --serial-items 4 --retry-items 8 --out "$RES/front-end-here"
step run_batch 540 "$PY" -m benchmarks.run_batch_compare --items 10000 --max-tokens 80 --out "$RES/run-batch"
step run_batch_retries 560 "$PY" -m benchmarks.run_batch_compare --items 10000 --max-tokens 80 --retries \
  --out "$RES/run-batch"
step profile16 300 "$PYSPY" record --subprocesses --threads --rate 100 --format raw \
  --output "$LOGS/profile16.txt" -- "$PY" -m benchmarks.run --sizes 10000 --max-tokens 16 --hf-items 8 \
  --serial-items 4 --retry-items 8 --out "$RES/profile16"
step big_model 240 "$PY" -m benchmarks.big_model --items 2000 --max-tokens 128 --out "$RES"
if [ -f "$RES/latest.json" ]; then
  step pipeline 150 "$PY" -m benchmarks.pipeline_only 20000 --add-to "$RES"
else
  step pipeline 150 "$PY" -m benchmarks.pipeline_only 20000 --out "$RES/pipeline-only"
fi
step floor 300 "$PY" -m benchmarks.pipeline_floor --items 20000 --window-sizes 2048 8192 --rounds 1 \
  --out "$RES/pipeline-floor"

if [ "$LOGS" != "$RES" ]; then
  for name in latest.json latest.md latest.png big_model.json; do
    [ -f "$RES/$name" ] && cp "$RES/$name" "$LOGS/$name"
  done
  for name in latest.json latest.md; do
    [[ $STEPS == *" profile16 "* && -f "$RES/profile16/$name" ]] && cp "$RES/profile16/$name" "$LOGS/profile16-$name"
    [[ $STEPS == *" here "* && -f "$RES/front-end-here/$name" ]] && cp "$RES/front-end-here/$name" "$LOGS/here-$name"
    [[ $STEPS == *" paired16 "* && -f "$RES/max-tokens-16/$name" ]] && cp "$RES/max-tokens-16/$name" "$LOGS/16-$name"
    [[ $STEPS == *" paired80_fcfs "* && -f "$RES/fcfs/$name" ]] && cp "$RES/fcfs/$name" "$LOGS/fcfs-$name"
    [[ $STEPS == *" variants80 "* && -f "$RES/variants80/$name" ]] &&
      cp "$RES/variants80/$name" "$LOGS/variants80-$name"
    [[ $STEPS == *" variants16 "* && -f "$RES/variants16/$name" ]] &&
      cp "$RES/variants16/$name" "$LOGS/variants16-$name"
    if [[ $name == latest.json && $STEPS == *" variants16 "* && -d "$RES/variants16/engine-core-profiles" ]]; then
      tar -C "$RES/variants16" -czf "$LOGS/variants16-engine-core-profiles.tgz" engine-core-profiles
      # the profiles side by side by function, readable as they come back
      "$PY" -m benchmarks.profile_compare "$RES/variants16/engine-core-profiles" --top 15 \
        > "$LOGS/variants16-profile-compare.md" 2>&1 || true
    fi
    if [[ $name == latest.json && $STEPS == *" variants16 "* && -d "$RES/variants16/run-process-profiles" ]]; then
      tar -C "$RES/variants16" -czf "$LOGS/variants16-run-process-profiles.tgz" run-process-profiles
    fi
    [[ $STEPS == *" floor "* && -f "$RES/pipeline-floor/$name" ]] && cp "$RES/pipeline-floor/$name" "$LOGS/floor-$name"
  done
  [[ $STEPS == *" contention "* && -f "$RES/contention/host-contention.json" ]] &&
    cp "$RES/contention/host-contention.json" "$LOGS/"
  [[ $STEPS == *" run_batch "* && -f "$RES/run-batch/run_batch.json" ]] && cp "$RES/run-batch/run_batch.json" "$LOGS/"
  [[ $STEPS == *" run_batch_retries "* && -f "$RES/run-batch/run_batch_retries.json" ]] &&
    cp "$RES/run-batch/run_batch_retries.json" "$LOGS/"
fi
if [ "${WARM_OUT:-0}" = 1 ]; then
  mapfile -t caches < <(compile_caches)
  if (( ${#caches[@]} )) && tar -C / -czf "$LOGS/compile-caches.tgz" "${caches[@]}" 2>> "$SUMMARY"; then
    kb=$(du -k "$LOGS/compile-caches.tgz" | cut -f1)
    if (( kb > 15 * 1024 )); then
      rm -f "$LOGS/compile-caches.tgz"
      echo "compile caches: ${caches[*]}: $kb KB packed, over the 15 MiB a file may bring back; left out" >> "$SUMMARY"
    else
      echo "compile caches: ${caches[*]} packed into compile-caches.tgz ($kb KB)" >> "$SUMMARY"
    fi
  else
    echo "compile caches: none to pack" >> "$SUMMARY"
  fi
fi
echo "session done in $(( $(date +%s) - started )) s; figures in $RES, logs in $LOGS" | tee -a "$SUMMARY"
