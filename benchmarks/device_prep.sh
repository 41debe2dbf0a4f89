#!/usr/bin/env bash
# Prepares, on this machine, what a lent GPU machine needs to run benchmarks/gpu_session.sh:
#     bash benchmarks/device_prep.sh [DIR] [--no-peers]    (DIR defaults to .device, which git ignores)
#
# A lent machine starts bare (its own python3 with torch and Triton, no network, no attnhal, no
# engine), gets only the working tree and the paths a run names in `carry` (64 MiB in all), and
# a loan is 15 minutes of device time: nothing may be fetched or built there. So this writes
#   DIR/attnhal-*.whl       this checkout as a wheel (every import package and the entry points
#                           that register the backends), built offline (--no-build-isolation);
#   DIR/commit.txt          its commit (+ "-dirty" with uncommitted changes): no .git travels;
#   DIR/peer-kernels/       the engines' Triton kernel files gpu_peers.py runs (SGLang's decode
#                           and extend, vLLM's unified and MLA decode), copied from the engine
#                           tiers' venvs (tests/engines/setup.sh: built there if missing, with the
#                           package index) by benchmarks/fetch_peer_kernels.py --from-python;
#                           --no-peers leaves them out (the wheel alone: tests/docs/test_gpu_session.py).
# gpu_session.sh installs the wheel into DIR/site when attnhal is not importable and reads the
# kernels from DIR/peer-kernels. The run, from docs/triton.md (Device session plan):
#     run(command="bash benchmarks/gpu_session.sh $OUT core", carry=[".device"], timeout_s=420)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.device}
PEERS=${2:-}
case $PEERS in ""|--no-peers) ;; *) echo "$PEERS (supported: --no-peers)" >&2; exit 2 ;; esac
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python3; fi

rm -rf "$DIR"/attnhal-*.whl "$DIR/peer-kernels" "$DIR/site"
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
# Built from a copy of the files git tracks or would (the working tree, as a run sends it), so
# that setuptools' scratch folders stay out of the checkout.
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$src"
"$PY" -m pip wheel --quiet --no-deps --no-build-isolation --no-index -w "$DIR" "$src" >/dev/null
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo -dirty)" >"$DIR/commit.txt"
if [ -z "$PEERS" ]; then
    for engine in sglang vllm; do
        env=$(bash tests/engines/setup.sh "$engine" | tail -n 1)
        "$PY" benchmarks/fetch_peer_kernels.py --dir "$DIR/peer-kernels" --peers "$engine" --from-python "$env/bin/python"
    done
fi
echo "$(du -sh "$DIR" | cut -f1) in $DIR: $(cd "$DIR" && ls -d ./*.whl peer-kernels/* 2>/dev/null | tr '\n' ' ')"
