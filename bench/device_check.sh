#!/usr/bin/env bash
# A prepared check for a lent device machine (the `run` tool: 16 x86 cores beside its GPU, Python
# 3.12 with numpy, ml_dtypes, torch and transformers, no network): what the 2-core sessions cannot
# measure, the issues' goals first, in one call of 10 minutes and a short second one.
#   bash bench/device_check.sh [1|2]
# Phase 1, where the CPU has AMX, in this order (each step's figures are on 1 and 2 threads):
#   host:      lscpu, `python -m tppasm info` (which ISA levels run natively).
#   tpp-amx:   the AMX BRGEMMs of issue #12's goal shapes against the AMX peak (bf16, int8), with the
#              batch chunks as the host's probe decides, then off.
#   gemm, mlp: the tuned DSL GEMM (bf16, 1024^3 and 2048^3; int8 1024^3 against torch._int_mm) and
#              MLP (bf16) against torch.
#   bert:      MiniLM 8 x 128 and 1 x 32, bf16, against torch (weights from .devcarry, below).
#   conv:      the ResNet-50 convolutions, batch 1, bf16, one blocking per layer, against torch.
#   amx-micro: the tile loops that decide the cycle model's reading, the timings they imply and the
#              model's kernels and blockings under them; then the BRGEMM's variants timed natively
#              (amx-variants: prefetch, batch chunks, A's rows 4 KiB apart or padded).
#   llm:       the LLaMA-style layer, bf16 and int8.
# Without AMX, phase 1 is host, the GEMM (f32 and bf16) and the MLP (f32) on 1, 2 and all cores, the
# LLaMA-style layer on 1 and all, and MiniLM on 2 and all: scaling past 2 threads.
# Phase 2 (the call right after phase 1, while the machine is warm, with the time left): where the CPU
# has AMX, what the first AMX host (Emerald Rapids, 2026-12-04) left short of the goals, looked at
# closer: the convolutions that lost to torch at batch 8 in bf16 (strided 1x1 shortcuts, now also
# with their pixels gathered into a flat GEMM, and the stem) tuned in full, MiniLM in fp32 with its
# per-step profile, the LLaMA layer's bf16 first token and its profile in one step (there they ran
# in different calls, 84.5 against 183.8 ms, while the machine's speed halved between the calls),
# the GEMM on all cores, and if time is left the fp32 convolutions at batch 8 (never measured on an
# AMX host; one blocking per layer); elsewhere the ResNet-50
# convolutions at batch 1 (one blocking per layer), the GEMM and the MLP on all cores.
# Each step has its own time limit, cut to what is left of DEADLINE (585 s), and writes
# $OUT/<step>.txt as it goes (at most 8 files a call; the tool brings back 8).
#
# Here, before the calls (once per checkout):
#   printf '/.whl/\n/.devcarry/\n' >> .git/info/exclude      # carried, never committed
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl iced-x86==1.21.0 mmap_ninja==0.9.0
#   PYTHONPATH=. .venv/bin/python -m bench.device_carry pack      # MiniLM's weights: .devcarry, 43 MiB
# then: run(command="bash bench/device_check.sh 1", carry=[".whl", ".devcarry"], timeout_s=600), and
# at once (the machine stays warm 30 s) run(command="DEADLINE=S bash bench/device_check.sh 2",
# carry=[".whl", ".devcarry"], timeout_s=S + 15) with S the seconds of device time left less 30.
# Rehearse it here with PY=.venv/bin/python OUT=/tmp/device_check bash bench/device_check.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
PHASE=${1:-1}
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
ALL=1 SOME=1 TWO=$((CORES >= 2 ? 2 : 1))     # 1, 2 and all cores; 1 and all; 2 and all
((CORES >= 2)) && ALL+=",2"
((CORES > 2)) && ALL+=",$CORES" && TWO+=",$CORES"
((CORES > 1)) && SOME+=",$CORES"

DEADLINE=${DEADLINE:-585}           # seconds: every step ends by then, inside the call's 600
step() {    # step NAME SECONDS COMMAND...: run it under a limit (cut to the time left before DEADLINE),
    local name=$1 limit=$2          # its output to the log and $OUT/NAME.txt
    shift 2
    local left=$((DEADLINE - SECONDS))
    if ((left < 15)); then
        echo "== $name: skipped, ${left} s left"
        return
    fi
    ((limit > left)) && limit=$left
    echo "== $name (limit ${limit} s): $*"
    local t0=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
    local rc=$?
    tail -n 40 "$OUT/$name.txt"
    echo "== $name: exit $rc after $((SECONDS - t0)) s"
}

bert() {    # bert ARGS...: python -m bench bert ARGS, MiniLM's weights from .devcarry when it was carried
    local path=$PYTHONPATH
    if [[ -d .devcarry ]]; then         # expanded in a copy: the carried folder stays under 64 MiB
        if [[ ! -d /tmp/devcarry ]]; then
            cp -r .devcarry /tmp/devcarry && "$PY" -m bench.device_carry expand /tmp/devcarry || return 1
        fi
        path="/tmp/devcarry:$path"
    fi
    PYTHONPATH=$path "$PY" -m bench bert "$@"
}
export -f bert
export PY

AMX=0
"$PY" -c "import sys; from isa.cpu import host; sys.exit('amx' not in host().levels)" && AMX=1
if [[ $PHASE == 1 ]]; then
    step host 30 bash -c "lscpu | head -n 30; echo; '$PY' -m tppasm info"
    if ((AMX)); then
        step tpp-amx 80 bash -c "for chunks in auto 0; do echo \"## TPPASM_AMX_CHUNKS=\$chunks\";
            TPPASM_AMX_CHUNKS=\$chunks '$PY' -m bench.tpp_gemm --shapes bf16:64:16,i8:64:16,bf16:32:16; done"
        step gemm 150 bash -c "'$PY' -m bench gemm --sizes 1024,2048 --dtypes bf16 --threads 1,2 --tune-seconds 8 \
            --no-progress && '$PY' -m bench gemm --sizes 1024 --dtypes i8 --threads 1,2 --tune-seconds 6 --no-progress"
        step mlp 80 "$PY" -m bench mlp --dtypes bf16 --threads 1,2 --tune-seconds 8 --no-progress
        step bert 100 bash -c "bert --shapes 8x128,1x32 --threads 1,2 --dtypes bf16 --runs 5"
        step conv 150 "$PY" -m bench conv --quick --batch 1 --threads 2 --dtypes bf16
        step amx-micro 90 bash -c "'$PY' -m bench amx-micro --figures /tmp/amx-figures.json &&
            '$PY' -m bench amx-static --quick --choices --figures /tmp/amx-figures.json; cat /tmp/amx-figures.json;
            '$PY' -m bench amx-variants"
        step llm 90 "$PY" -m bench llm --threads 1,2 --runs 3
    else
        step gemm 170 "$PY" -m bench gemm --sizes 1024 --dtypes f32,bf16 --threads "$ALL" --tune-seconds 8 --no-progress
        step mlp 100 "$PY" -m bench mlp --dtypes f32 --threads "$ALL" --tune-seconds 8 --no-progress
        step llm 120 "$PY" -m bench llm --threads "$SOME" --runs 3
        step bert 130 bash -c "bert --shapes 8x128,1x32 --threads $TWO --dtypes f32,bf16 --runs 5"
    fi
elif ((AMX)); then       # closer looks at what the first AMX host left short of the goals
    step conv-weak 170 "$PY" -m bench conv --batch 8 --threads 2 --dtypes bf16 \
        --layers res5a_branch1,res4a_branch1,res3a_branch1,res2a_branch1,conv1
    step bert-f32 120 bash -c "bert --shapes 8x128,1x32 --threads 1,2 --dtypes f32 --runs 5 &&
        bert --profile --shapes 8x128 --threads 1 --dtypes f32"
    step llm-profile 70 bash -c "'$PY' -m bench llm --dtypes bf16 --threads 1 --runs 3 &&
        '$PY' -m bench llm --profile --dtypes bf16 --threads 1"
    step gemm-all 100 "$PY" -m bench gemm --sizes 1024 --dtypes f32,bf16 --threads "$CORES" --tune-seconds 8 --no-progress
    step conv-f32 150 "$PY" -m bench conv --quick --batch 8 --threads 2 --dtypes f32
else
    step conv-all 150 "$PY" -m bench conv --quick --batch 1 --threads "$CORES" --dtypes f32
    step gemm-all 120 "$PY" -m bench gemm --sizes 1024 --dtypes f32,bf16 --threads "$CORES" --tune-seconds 8 --no-progress
    step mlp-all 60 "$PY" -m bench mlp --dtypes f32,bf16 --threads "$CORES" --tune-seconds 8 --no-progress
fi
echo "== phase $PHASE done in $SECONDS s; files in $OUT"
