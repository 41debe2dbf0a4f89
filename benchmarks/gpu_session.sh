#!/usr/bin/env bash
# One command for a lent GPU machine (CUDA or ROCm): bash benchmarks/gpu_session.sh OUT [core|rest|mla]
#
# Writes everything under OUT (at most 8 files): summary.txt (one line per part: ok, FAIL,
# timeout or SKIP, seconds) and one log per part. Uses $PYTHON, else .venv/bin/python when
# the README's venv exists, else python3; where that python lacks attnhal, installs the wheel
# benchmarks/device_prep.sh left in .device (offline, into .device/site), else nothing.
# A device loan is 15 minutes of device time, the machine's start (minutes) and the transfers
# included, and one command may run 10 minutes: a run is capped at 6 minutes (BUDGET_S), a part
# that would start past the cap is skipped with a line saying so, and the peers' table stops
# starting shapes at its own budget (the rows left are listed NOT RUN). PLAN core (default):
# the referee's first 15 shapes, the bandwidth/prefill check, the graph tests; PLAN rest (a
# second loan): the other 14 GQA shapes, spill relief's speed against the rows' own forms, the
# worker end to end (GQA, and MLA at EAGLE 1 and 3), capture aftermath, graph replay; PLAN mla
# (a third loan): the referee's 24 MLA shapes. Each ends, in what budget is
# left, with the compile check's phase tier for the device's target under its own Triton.
# docs/triton.md (Device session plan) says why and what is left out.
# Without a CUDA/HIP device it runs the parts a CPU can (platform info, the graph tests,
# which skip there, the device seam's unit tests, the benchmarks' call sites against SDPA
# and the engines' kernels under the Triton interpreter) and prints one SKIP line per device part.
set -u
OUT=${1:?usage: bash benchmarks/gpu_session.sh OUT [core|rest|mla]}
PLAN=${2:-core}
case $PLAN in core|rest|mla) ;; *) echo "PLAN=$PLAN (supported: core, rest, mla)" >&2; exit 2 ;; esac
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python3; fi
# A bare lent machine has no attnhal and no network: benchmarks/device_prep.sh wrote this
# checkout's wheel and the engines' kernel files into .device here, and the run carried it.
DEVICE_DIR=${ATTNHAL_DEVICE_DIR:-.device}
FROM="$PY's own"
if ! "$PY" -c "import attnhal_triton" 2>/dev/null && ls "$DEVICE_DIR"/attnhal-*.whl >/dev/null 2>&1; then
    PIP_ROOT_USER_ACTION=ignore "$PY" -m pip install --quiet --no-deps --no-index --target "$DEVICE_DIR/site" \
        "$DEVICE_DIR"/attnhal-*.whl
    export PYTHONPATH="$(cd "$DEVICE_DIR/site" && pwd)${PYTHONPATH:+:$PYTHONPATH}"
    FROM="the wheel in $DEVICE_DIR"
fi
# The engines' kernel files for gpu_peers.py (without them the peers are "not available").
if [ -d "$DEVICE_DIR/peer-kernels" ]; then DEFAULT_PEERS=$DEVICE_DIR/peer-kernels; else DEFAULT_PEERS=.peer-kernels; fi
PEERS_DIR=${ATTNHAL_PEER_KERNELS:-$DEFAULT_PEERS}
# The test suite's interpreter switch and platform simulation must not leak into device runs.
unset TRITON_INTERPRET ATTNHAL_PLATFORM
BUDGET_S=360
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
FAILED=0

note() { echo "$*" | tee -a "$SUMMARY"; }

# part NAME LOG LIMIT_S CMD...: run CMD with its output appended to OUT/LOG, one summary line.
part() {
    local name=$1 log=$2 limit=$3 left=$((BUDGET_S - SECONDS)) start=$SECONDS rc status
    shift 3
    if [ "$left" -lt 15 ]; then note "SKIP $name: the session's ${BUDGET_S}s budget is spent"; return; fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "### $name: $* (limit ${limit}s)" >>"$OUT/$log"
    timeout "$limit" "$@" >>"$OUT/$log" 2>&1
    rc=$?
    case $rc in
        0) status=ok ;;
        124) status="timeout after ${limit}s"; FAILED=1 ;;
        *) status="FAIL rc=$rc"; FAILED=1 ;;
    esac
    note "$(printf '%-34s %-18s %4ds  %s' "$name" "$status" $((SECONDS - start)) "$log")"
}

skip() { note "SKIP $1: no CUDA/HIP device"; }

note "attnhal GPU session $(date -u +%FT%TZ), plan $PLAN, python $PY, git $(git rev-parse --short HEAD 2>/dev/null || cat "$DEVICE_DIR/commit.txt" 2>/dev/null || echo '?')"
note "attnhal from $FROM; peer kernels from $PEERS_DIR"
part "attnhal info" info.txt 30 "$PY" -m attnhal info
if "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    DEVICE=1
else
    DEVICE=0
fi

# Last in every device plan, in what budget is left: the phase tier of the compile check on this
# device's own target with this machine's Triton (which may not be the release CI checks, and
# which may spill where that one does not: docs/triton.md, Triton releases).
compile_share() {
    local target
    target=$("$PY" -c "from attnhal.platform import detect; from attnhal_triton.compile_check import compile_target
print(compile_target(detect()))")
    part "compile share on this Triton ($target)" compile.txt 60 "$PY" -m attnhal_triton.compile_coverage \
        --by kernel --targets "$target" --jobs 8
}

graph_tests() {
    part "graph tests (device + seam)" pytest.txt "$1" "$PY" -m pytest -q -rs -p no:cacheprovider \
        tests/graphs/test_device_gpu.py tests/graphs/test_device_unit.py \
        backends/attnhal_triton/tests/test_spill_relief.py::test_a_spilling_row_is_relieved_by_the_devices_own_compiler
}

if [ $DEVICE = 1 ] && [ "$PLAN" = core ]; then
    part "engines' kernels (gpu_peers core)" bandwidth.txt 240 "$PY" benchmarks/gpu_peers.py --shapes core \
        --budget-s 220 --peers-dir "$PEERS_DIR"
    part "triton bandwidth + prefill" bandwidth.txt 60 "$PY" benchmarks/gpu_bandwidth.py --check
    graph_tests 60
    compile_share
elif [ $DEVICE = 1 ] && [ "$PLAN" = mla ]; then
    part "engines' kernels (gpu_peers mla)" bandwidth.txt 330 "$PY" benchmarks/gpu_peers.py --shapes mla \
        --budget-s 310 --peers-dir "$PEERS_DIR"
    compile_share
elif [ $DEVICE = 1 ]; then
    part "engines' kernels (gpu_peers rest)" bandwidth.txt 180 "$PY" benchmarks/gpu_peers.py --shapes rest \
        --budget-s 160 --peers-dir "$PEERS_DIR"
    part "spill relief vs the rows' forms" relief.txt 45 "$PY" benchmarks/relief_speed.py
    part "worker end to end (triton)" worker.txt 60 "$PY" -m attnhal demo --backend triton \
        --spec-steps 3 --topk 2 --draft-tokens 4 --batch-size 8 --max-bs 8 --max-new-tokens 32 --json
    for steps in 1 3; do
        part "worker on MLA (triton, eagle $steps)" worker.txt 45 "$PY" -m attnhal demo --backend triton \
            --model mla --spec-steps "$steps" --batch-size 8 --max-bs 8 --max-new-tokens 32 --page-size 16 --json
    done
    for mode in guarded driver unguarded; do
        part "capture aftermath ($mode)" aftermath.txt 20 "$PY" benchmarks/capture_aftermath.py --mode "$mode"
    done
    part "decode graph replay vs eager" replay.txt 60 "$PY" benchmarks/graph_replay.py
    compile_share
else
    graph_tests 150
    if [ "$PLAN" = core ]; then
        skip "engines' kernels (gpu_peers core)"
        skip "triton bandwidth + prefill"
    elif [ "$PLAN" = mla ]; then
        skip "engines' kernels (gpu_peers mla)"
    else
        skip "engines' kernels (gpu_peers rest)"
        skip "spill relief vs the rows' forms"
        skip "worker end to end (triton)"
        skip "worker on MLA (triton, eagle 1 and 3)"
        skip "capture aftermath (guarded, driver, unguarded)"
        skip "decode graph replay vs eager"
    fi
    skip "compile share on this Triton"
    TRITON_INTERPRET=1 part "benchmark call sites vs sdpa (cpu)" bandwidth.txt 60 \
        "$PY" benchmarks/gpu_bandwidth.py --check
    TINY=decode:2x32,tree8:2x32
    [ "$PLAN" = mla ] && TINY=mla:2x64,mla8:2x64
    TRITON_INTERPRET=1 part "engines' kernels plumbing (cpu)" bandwidth.txt 120 \
        "$PY" benchmarks/gpu_peers.py --tiny --shapes "$TINY" --peers-dir "$PEERS_DIR"
fi
note "done in ${SECONDS}s: $([ $FAILED = 0 ] && echo 'no part failed' || echo 'some part FAILED')"
exit $FAILED
