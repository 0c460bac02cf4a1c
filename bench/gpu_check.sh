#!/usr/bin/env bash
# One prepared check for a CUDA machine (one H200; torch + transformers + peft, no vLLM, no TRL, no internet).
# Runs with the machine's own python on a copy of the working tree (no venv, installs nothing), < 8 minutes
# (< 11 with vLLM installed):
#   1. env          versions, GPU, which optional packages exist (vLLM absent => HF generate everywhere)
#   2. hf-generate  random-weight Qwen2.5-0.5B shape, bf16: tokens/s at batch 1/8/32/64, dynamic cache
#   3. rollout      EpisodeRunner -> TransformersBackend on cuda, 1/8/32 slots (TextWorld if installed,
#                   else a synthetic text env; the row says which)
#   4. opcd         distill.opcd.OPCDTrainer on a random-weight Qwen3-1.7B shape: training tokens/s and MFU
#                   (only when `import distill.opcd` works)
#   5. vllm         the vllm backend (bench/gpu_check_vllm.py): rollout episodes/min at 1/8/32/64 slots with
#                   prefix caching, LoRA hot-swap latency, sleep/wake time and the GPU memory sleep frees; only
#                   when vLLM imports (VLLM_PYTHON=... picks another interpreter for it), else one line says it
#                   was skipped
#   6. hf-generate  as 2, with the static cache + torch.compile (last: compilation is the likeliest to time out)
# Each section is its own process under its own timeout; a failure or timeout is a row of the table and the
# next section runs. Rows are appended to $OUT/gpu_check.jsonl as they are measured, the table is printed at
# the end.  Usage: bash bench/gpu_check.sh [--cpu-dry-run]   (PYTHON=... picks the interpreter)
set -u

cd "$(dirname "$0")/.." || exit 1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
DRY=()
SCALE=1
if [ "${1:-}" = "--cpu-dry-run" ]; then
  DRY=(--cpu-dry-run)
  SCALE=3  # a busy 2-core CPU is slower at the tiny shapes than the GPU at the real ones
elif [ -n "${1:-}" ]; then
  echo "unknown argument '$1'; accepted: --cpu-dry-run" >&2
  exit 2
fi
OUTDIR="${OUT:-$(mktemp -d)}"
RESULTS="$OUTDIR/gpu_check.jsonl"
LOG="$OUTDIR/gpu_check.log"
: > "$RESULTS"
STARTED=$(date +%s)

if ! "$PY" -c "import torch, transformers" 2>>"$LOG"; then
  echo "$PY cannot import torch and transformers; set PYTHON to an interpreter that can" >&2
  exit 1
fi

fail_row() {  # section, setting, result, notes -> one row in the results file
  "$PY" - "$RESULTS" "$@" <<'EOF'
import json, sys
path, section, setting, result, notes = sys.argv[1:6]
with open(path, "a") as handle:
    handle.write(json.dumps({"section": section, "setting": setting, "result": result, "notes": notes}) + "\n")
EOF
}

section() {  # name, limit in seconds, gpu_check.py arguments...
  local name="$1" limit=$(( $2 * SCALE )); shift 2
  local begin rc
  begin=$(date +%s)
  echo "== $name (limit ${limit}s)"
  # ${DRY[@]+...}: an empty array under `set -u` is an error in bash < 4.4
  timeout -k 10 "$limit" "$PY" bench/gpu_check.py "$@" --results "$RESULTS" ${DRY[@]+"${DRY[@]}"} >>"$LOG" 2>&1
  rc=$?
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    fail_row "$1" "$name" "TIMED OUT after ${limit}s" "rows measured before the timeout are kept; see $LOG"
  elif [ "$rc" -ne 0 ]; then
    fail_row "$1" "$name" "FAILED (exit $rc)" "$(grep -v '^\s*$' "$LOG" | tail -n 1 | tr '|' '/' | cut -c1-300)"
  fi
  echo "   exit $rc after $(( $(date +%s) - begin ))s"
}

section "environment" 45 env
section "HF generate, dynamic cache" 90 hf-generate --cache dynamic
section "rollout generate path" 90 rollout --slots 1,8,32
if "$PY" -c "import distill.opcd" >>"$LOG" 2>&1; then
  section "OPCD step" 120 opcd
else
  fail_row opcd "OPCD step" "skipped" "import distill.opcd failed: $(tail -n 1 "$LOG" | tr '|' '/' | cut -c1-200)"
fi
VPY="${VLLM_PYTHON:-$PY}"
if "$VPY" -c "import vllm" >>"$LOG" 2>&1; then
  PY="$VPY" section "vLLM backend" 180 vllm
else
  echo "== vLLM backend: skipped, vLLM is not installed for $VPY (pip install vllm, or VLLM_PYTHON=...)"
  fail_row vllm "vLLM backend" "skipped" "vLLM is not installed for $VPY; the vllm backend is not measured"
fi
section "HF generate, static cache + torch.compile" 120 hf-generate --cache static

echo
echo "# gpu_check: $(( $(date +%s) - STARTED ))s in all; full log in $LOG"
"$PY" bench/gpu_check.py report --results "$RESULTS" || cat "$RESULTS"
