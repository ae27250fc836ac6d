#!/usr/bin/env bash
# The GPU check of nblstm's CUDA target: the one script to run on a machine
# with an NVIDIA GPU (it is not part of CI, which has none).
#
#   scripts/gpu_check.sh            # install .[cuda,test], then check and bench
#   NBLSTM_NO_INSTALL=1 scripts/gpu_check.sh
#                                   # numba-cuda already installed (offline machines):
#                                   # use the checkout through PYTHONPATH instead
#
# Steps, each under its own timeout (seconds, overridable; NBLSTM_TESTS picks the test paths):
#   1. tests/cuda on the real GPU: every op and option against the CPU target
#      and the float64 reference, dispatch rules, PTX compile checks;
#   2. run_check: every op, and LSTMCell with every option, on the GPU against the CPU target on larger shapes,
#      a table of the largest errors, PyTorch/CuPy round trips when installed;
#   3. run_bench: forward and forward+backward times on DeepBench-like shapes
#      (T=25, H in {512, 1024}, B in {1, 16, 64}) next to cuDNN when PyTorch is installed.
# Logs go to ${NBLSTM_LOG_DIR:-$TMPDIR/nblstm_gpu_check}/. Exit status: that of the first failing step.
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
LOG_DIR=${NBLSTM_LOG_DIR:-${TMPDIR:-/tmp}/nblstm_gpu_check}
INSTALL_TIMEOUT=${INSTALL_TIMEOUT:-600}
TEST_TIMEOUT=${TEST_TIMEOUT:-420}
CHECK_TIMEOUT=${CHECK_TIMEOUT:-300}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-300}
mkdir -p "$LOG_DIR"
export PYTHONUNBUFFERED=1
unset NUMBA_ENABLE_CUDASIM  # the real GPU, not the simulator

status=0
step() {  # step NAME TIMEOUT COMMAND...: run, log, remember the first failure
    local name=$1 limit=$2
    shift 2
    echo "=== $name (timeout ${limit}s)"
    timeout "$limit" "$@" 2>&1 | tee "$LOG_DIR/$name.log"
    local rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ]; then
        echo "=== $name failed with exit status $rc"
        [ "$status" -eq 0 ] && status=$rc
    fi
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
if [ "${NBLSTM_NO_INSTALL:-0}" = "1" ]; then
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
    step install "$INSTALL_TIMEOUT" "$PYTHON" -m pip install -q -e ".[cuda,test]"
fi
"$PYTHON" -c "import numba, numba.cuda as c, numpy; print('numba', numba.__version__, '| numpy', numpy.__version__, \
'| cuda available', c.is_available())" || true

step tests "$TEST_TIMEOUT" "$PYTHON" -m pytest ${NBLSTM_TESTS:-tests/cuda} -q -p no:cacheprovider
step check "$CHECK_TIMEOUT" "$PYTHON" -c "import sys; from nblstm._tools.gpu_check import run_check; sys.exit(run_check())"
step bench "$BENCH_TIMEOUT" "$PYTHON" -c "import sys; from nblstm._tools.gpu_check import run_bench; sys.exit(run_bench())"
echo "=== gpu_check: exit status $status"
exit "$status"
