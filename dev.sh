#!/usr/bin/env bash
# Sets up a private virtual environment (.venv) and runs: demo | test | bench [SUITE...] | shell
# Needs only python3 (>= 3.10) with its venv module; never touches the system Python.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
PY="$VENV/bin/python"

setup() {   # $1: pip extras, e.g. test or test,bench
    local stamp="$VENV/.installed-$1"
    if [ ! -x "$PY" ]; then
        "$PYTHON" -m venv "$VENV" || { echo "python3 -m venv failed: install python3-venv (apt-get install -y python3-venv)" >&2; exit 1; }
    fi
    if [ ! -f "$stamp" ] || [ setup.cfg -nt "$stamp" ]; then
        "$PY" -m pip install -q --upgrade pip
        "$PY" -m pip install -q -e ".[$1]"
        touch "$stamp"
    fi
}

cmd=${1:-demo}
shift || true
case "$cmd" in
    demo)  setup test; exec "$PY" -m tppasm demo "$@" ;;
    test)  setup test; exec "$PY" -m pytest tests "$@" ;;
    bench) setup test,bench; exec "$PY" -m bench "${@:-all}" ;;
    shell) setup test; exec "$PY" "$@" ;;
    *) echo "usage: ./dev.sh demo | test [pytest args] | bench [SUITE] | shell [python args]" >&2; exit 2 ;;
esac
