#!/usr/bin/env bash
# The payload for a GPU machine without a package registry (docs/gpu.md): the site folder that
# ../shared/gpu/build_payload.sh builds (vLLM and this project's dependencies for Python 3.12), plus Polars, which
# writes the JSON-lines mirrors (without it batchgen falls back to orjson: the same bytes, more interpreter time in
# every window's staging), and py-spy (its binary lands in the site's bin/: gpu_session.sh's profile16 step), in
# pieces small enough to travel beside this working tree in one call (45 MiB; a call carries at most 64 MiB). Run
# from the repository root on a machine that reaches the registry:
#
#   bash benchmarks/gpu_payload.sh          # ~4 min -> .xfer/c00 ... (git-ignored), device_setup.sh in the last
#   SKIP_BUILD=1 bash benchmarks/gpu_payload.sh   # reuse the site folder already built in $W
#
# Then, on the GPU machine, one call per piece (`cp .xfer/cNN/* /tmp/stage/`, carry [".xfer/cNN"]) and with the
# last one `bash .xfer/cNN/device_setup.sh` (../shared/gpu/README.md); benchmarks/gpu_session.sh's session.log
# says `polars writer True` when Polars arrived.
set -euo pipefail
REPO=$(git rev-parse --show-toplevel)
SHARED=${SHARED:-$REPO/../shared/gpu}
W=${W:-/tmp/gpu-payload}
PIECE=${PIECE:-45M}
[ "${SKIP_BUILD:-0}" = 1 ] || W=$W bash "$SHARED/build_payload.sh"
P="--python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none --platform manylinux_2_28_x86_64"
P="$P --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any"
versions=$(grep -E '^polars(-runtime-32)?==' "$REPO/requirements-gpu.lock")
rm -rf "$W/polars" && mkdir -p "$W/polars"
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps --only-binary=:all: $P -d "$W/polars" $versions
# shellcheck disable=SC2086
python3 -m pip install -q --no-deps --no-compile --no-index --only-binary=:all: $P --target "$W/site" "$W"/polars/*.whl
rm -rf "$W/py-spy" && mkdir -p "$W/py-spy"
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps --only-binary=:all: $P --platform manylinux1_x86_64 \
  --platform manylinux_2_5_x86_64 -d "$W/py-spy" "py-spy==${PYSPY_VERSION:-0.4.3}"
# shellcheck disable=SC2086
python3 -m pip install -q --upgrade --no-deps --no-compile --no-index --only-binary=:all: $P \
  --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 --target "$W/site" "$W"/py-spy/*.whl
tar -C "$W/site" -cf - . | gzip -5 > "$W/site.tgz"
(cd "$W" && sha256sum site.tgz > site.tgz.sha256)
rm -rf "$W/parts" "$REPO"/.xfer/c[0-9][0-9] && mkdir -p "$W/parts" "$REPO/.xfer"
split -b "$PIECE" -d -a 2 "$W/site.tgz" "$W/parts/site.tgz.part"
for f in "$W"/parts/*; do n=${f##*part}; mkdir -p "$REPO/.xfer/c$n"; cp "$f" "$REPO/.xfer/c$n/"; done
last=$(ls -d "$REPO"/.xfer/c[0-9][0-9] | tail -1)
cp "$W/site.tgz.sha256" "$SHARED/device_setup.sh" "$last/"
grep -qxF /.xfer/ "$REPO/.git/info/exclude" 2>/dev/null || echo /.xfer/ >> "$REPO/.git/info/exclude"
echo "polars: $(ls "$W/site" | grep -i polars | tr '\n' ' ')"; echo "py-spy: $(ls "$W/site/bin" | grep py-spy)"
ls -l "$W/site.tgz"; echo "pieces: $(ls "$REPO/.xfer" | tr '\n' ' ')  last: ${last#"$REPO"/}"
