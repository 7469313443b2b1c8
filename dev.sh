#!/usr/bin/env bash
# Sets up a private virtual environment (.venv) and runs: demo | test | bench [SUITE...] | shell | pin
# Needs only python3 (>= 3.10) with its venv module; never touches the system Python.
# Installs are pinned: constraints.txt lists every package (transitive ones too) at the version the
# test suite last passed with; `./dev.sh pin` refreshes it.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
PY="$VENV/bin/python"
PINS=constraints.txt
EXTRAS_ALL=test,bench,notebook

pin_python() {   # the Python version constraints.txt was made with, e.g. 3.11
    sed -n 's/^# python: \([0-9.]*\).*/\1/p' "$PINS" | head -n 1
}

setup() {   # $1: pip extras, e.g. test or test,bench
    local stamp="$VENV/.installed-$1"
    if [ ! -x "$PY" ]; then
        "$PYTHON" -m venv "$VENV" || { echo "python3 -m venv failed: install python3-venv (apt-get install -y python3-venv)" >&2; exit 1; }
    fi
    if [ ! -f "$stamp" ] || [ setup.cfg -nt "$stamp" ] || [ "$PINS" -nt "$stamp" ]; then
        local have want constrain=(-c "$PINS")
        have=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
        want=$(pin_python)
        if [ "$have" != "$want" ]; then
            echo "warning: $PINS pins versions for Python $want and this is Python $have; installing from" \
                 "setup.cfg's ranges instead (run with PYTHON=python$want for the pinned set)" >&2
            constrain=()
        fi
        "$PY" -m pip install -q --upgrade pip
        "$PY" -m pip install -q "${constrain[@]}" -e ".[$1]"
        touch "$stamp"
    fi
}

# Refresh constraints.txt: install every extra from setup.cfg's ranges into a fresh venv, run the
# test suite there, and write the versions only if it passes.
pin() {
    local tmp
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' RETURN
    "$PYTHON" -m venv "$tmp/venv"
    "$tmp/venv/bin/python" -m pip install -q --upgrade pip
    "$tmp/venv/bin/python" -m pip install -q -e ".[$EXTRAS_ALL]"
    "$tmp/venv/bin/python" -m pytest tests -q -x -n auto "$@"
    {
        echo "# Every package the extras $EXTRAS_ALL install, at versions the test suite passed with."
        echo "# Made by ./dev.sh pin (edit setup.cfg's ranges, not this file); dev.sh and .ci/run install with -c."
        echo "# python: $("$tmp/venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
        echo "# date: $(date -u +%Y-%m-%d)"
        # a local build label (torch 2.13.0+cpu) is dropped: ==2.13.0 still takes the CPU wheel on disk
        "$tmp/venv/bin/python" -m pip freeze --exclude-editable | sed 's/+[A-Za-z0-9.]*$//' | sort -f
    } > "$PINS"
    echo "wrote $PINS ($(grep -vc '^#' "$PINS") packages)"
}

cmd=${1:-demo}
shift || true
case "$cmd" in
    demo)  setup test; exec "$PY" -m tppasm demo "$@" ;;
    test)  setup test; exec "$PY" -m pytest tests -n auto "$@" ;;     # one worker a core (-n 0: one process)
    bench) setup test,bench; exec "$PY" -m bench "${@:-all}" ;;
    shell) setup test; exec "$PY" "$@" ;;
    pin)   pin "$@" ;;
    *) echo "usage: ./dev.sh demo | test [pytest args] | bench [SUITE] | shell [python args] | pin" >&2; exit 2 ;;
esac
