#!/usr/bin/env bash
# A prepared check for a lent device machine (the `run` tool: 16 x86 cores beside its GPU, Python
# 3.12 with numpy, ml_dtypes and torch, no network): what the 2-core sessions cannot measure, in
# one call of about 8 minutes.
#   1. host:      lscpu, `python -m tppasm info` (which ISA levels run natively).
#   2. amx-micro: where the CPU has AMX, the tile loops that decide the cycle model's reading
#                 (`bench/amx_micro.py`), the host's timings they imply ($OUT/amx-figures.json) and
#                 the model's kernels and candidate blockings again under them (`amx-static
#                 --quick --choices --figures`), then the AMX BRGEMMs of issue #12's goal shapes with the
#                 batch chunks off, on, and as the host's probe decides (`bench/tpp_gemm.py`),
#                 and the int8 one.
#   3. gemm:      the tuned DSL GEMM at 1024^3 on 1, 2 and all cores (bf16 where the CPU has AMX or
#                 AVX512-BF16, else f32), against numpy and torch: scaling past 2 threads.
#   4. llm:       the LLaMA-style layer, bf16 and int8, on 1 thread and all cores.
# Each step has its own time limit and writes $OUT/<step>.txt: at most 6 files with the figures,
# all of which come back (the tool returns up to 8).
#
# Here, before the call (once per checkout; .whl stays out of git through .git/info/exclude):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl iced-x86==1.21.0 mmap_ninja==0.9.0
# then: run(command="bash bench/device_check.sh", carry=[".whl"], timeout_s=560).
# Rehearse it here with PY=.venv/bin/python OUT=/tmp/device_check bash bench/device_check.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
OUT=${OUT:-/tmp/device_check}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "installing the carried wheels failed" >&2; exit 1; }
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
CORES=$(nproc)
GEMM_THREADS=1 LLM_THREADS=1          # 1, 2 and all cores for the GEMM; 1 and all for the layer
((CORES >= 2)) && GEMM_THREADS+=",2"
((CORES > 2)) && GEMM_THREADS+=",$CORES"
((CORES > 1)) && LLM_THREADS+=",$CORES"

step() {    # step NAME SECONDS COMMAND...: run it under a limit, its output to the log and $OUT/NAME.txt
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit} s): $*"
    local t0=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
    local rc=$?
    tail -n 40 "$OUT/$name.txt"
    echo "== $name: exit $rc after $((SECONDS - t0)) s"
}

step host 60 bash -c "lscpu | head -n 30; echo; '$PY' -m tppasm info"
if "$PY" -c "import sys; from isa.cpu import host; sys.exit('amx' not in host().levels)"; then
    GEMM_DTYPE=bf16
    step amx-micro 120 bash -c "'$PY' -m bench amx-micro --figures '$OUT/amx-figures.json' &&
        '$PY' -m bench amx-static --quick --choices --figures '$OUT/amx-figures.json'"
    step tpp-amx 180 bash -c "for chunks in 0 1 auto; do echo \"## TPPASM_AMX_CHUNKS=\$chunks\";
        TPPASM_AMX_CHUNKS=\$chunks '$PY' -m bench.tpp_gemm --shapes bf16:64:16,i8:64:16,bf16:32:16; done"
elif "$PY" -c "import sys; from bench.peaks import units; sys.exit(units('bf16')[0] != 'BF16-dot')"; then
    GEMM_DTYPE=bf16
else
    GEMM_DTYPE=f32
fi
step gemm 200 "$PY" -m bench gemm --sizes 1024 --dtypes "$GEMM_DTYPE" --threads "$GEMM_THREADS" \
    --tune-seconds 10 --no-progress
step llm 150 "$PY" -m bench llm --threads "$LLM_THREADS" --runs 5
echo "== done in $SECONDS s; files in $OUT"
