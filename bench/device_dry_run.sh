#!/usr/bin/env bash
# A dry-run check of the node path on a real NVIDIA GPU, which it never changes.
#
# Every gpugov command runs under bench/nvml_guard.py (every NVML setter refused and
# logged). It records: `gpugov status`; `nvidia-smi -q`; the daemon (`gpugov run
# --dry-run`, mpc-online with no profile, the real GPU through NVML) for DURATION seconds
# against the engine page of `gpugov emulate` under `gpugov load`, while bench/gpu_load.py
# loads the real GPU in phases (idle, bf16 matmul, idle, copy, idle) at its own clocks;
# and nvidia-smi's readings every 500 ms beside it, to compare with the daemon's
# (bench/device_compare.py OUT prints the comparison).
#
#   OUT=/tmp/check PYTHON=python3 bash bench/device_dry_run.sh [DURATION]
#
# PORT and METRICS_PORT choose the emulator's and the daemon's loopback ports (18000, 19400).
# BACKEND=emulated runs the same against the emulator's GPU (no NVIDIA GPU needed: a
# rehearsal of the script; the load phases are then skipped).
set -u
DURATION=${1:-150}
OUT=${OUT:-/tmp/gpugov-device-check}
PY=${PYTHON:-python3}
BACKEND=${BACKEND:-nvml}
PORT=${PORT:-18000}
METRICS_PORT=${METRICS_PORT:-19400}
mkdir -p "$OUT"
WORK=$(mktemp -d)
LOG="$OUT/logs.txt"
GUARD="$PY bench/nvml_guard.py --log $OUT/setters.jsonl --"
: >"$LOG"
note() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$LOG"; }
pids=()
cleanup() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

note "host: $(uname -sr), python: $($PY --version 2>&1)"
if [ "$BACKEND" = nvml ]; then
  nvidia-smi -q >"$OUT/nvidia-smi-q.txt" 2>&1
  nvidia-smi -q -d SUPPORTED_CLOCKS >>"$OUT/nvidia-smi-q.txt" 2>&1
fi
note "emulated engine on 127.0.0.1:$PORT"
$GUARD emulate --profile h200-sxm-llama3-8b --address "127.0.0.1:$PORT" \
  --served-model-name meta-llama/Llama-3.1-8B-Instruct >>"$LOG" 2>&1 &
pids+=($!)
for _ in $(seq 60); do
  curl -sf "http://127.0.0.1:$PORT/metrics" >/dev/null && break
  sleep 1
done

cat >"$WORK/node.toml" <<TOML
[daemon]
period_s = 0.25
metrics_address = "127.0.0.1:$METRICS_PORT"
backend = "$BACKEND"
$( [ "$BACKEND" = emulated ] && echo "emulator = \"http://127.0.0.1:$PORT\"" )
dry_run = true
log_level = "info"
state_dir = "$WORK/state"

[[domains]]
name = "check"
gpus = [0]
ttft_slo_s = 1.0
tpot_slo_s = 0.05

[domains.engine]
kind = "vllm"
url = "http://127.0.0.1:$PORT/metrics"

[domains.controller]
kind = "mpc-online"
TOML
cat "$WORK/node.toml" >>"$LOG"
$GUARD check-config "$WORK/node.toml" >>"$LOG" 2>&1
note "gpugov status"
$GUARD status --config "$WORK/node.toml" --engine-url "http://127.0.0.1:$PORT/metrics" \
  >"$OUT/status.txt" 2>&1
echo "rc $?" >>"$OUT/status.txt"

if [ "$BACKEND" = nvml ]; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,clocks_event_reasons.active \
    --format=csv,noheader,nounits -lms 500 >"$OUT/nvidia-smi.csv" 2>&1 &
  pids+=($!)
fi
note "daemon, dry run, $DURATION s"
$GUARD run --config "$WORK/node.toml" --record "$OUT/record.jsonl" >>"$LOG" 2>&1 &
daemon=$!
# DURATION counts from when the daemon answers, not from the script's start: on a loaded
# machine the interpreter starts before it (emulator, check-config, status) took the
# whole of a short DURATION, and the daemon was stopped before its first tick.
for _ in $(seq 60); do
  curl -sf "http://127.0.0.1:$METRICS_PORT/metrics" >/dev/null && break
  kill -0 "$daemon" 2>/dev/null || break
  sleep 1
done
started=$SECONDS
$GUARD load --trace azure-conv-10min --url "http://127.0.0.1:$PORT" --duration "$DURATION" \
  --quiet >>"$LOG" 2>&1 &
pids+=($!)
if [ "$BACKEND" = nvml ]; then
  phase=$(( (DURATION - 10) / 5 ))
  $PY bench/gpu_load.py --phases idle,matmul,idle,copy,idle --seconds "$phase" \
    >"$OUT/gpu_load.jsonl" 2>>"$LOG"
fi
sleep_left=$(( DURATION + 5 - (SECONDS - started) ))
[ "$sleep_left" -gt 0 ] && sleep "$sleep_left"
curl -s "http://127.0.0.1:$METRICS_PORT/metrics" | grep -E '^gpugov_' | head -80 >>"$LOG"
$GUARD status --config "$WORK/node.toml" --governor-metrics http://127.0.0.1:$METRICS_PORT/metrics \
  >>"$LOG" 2>&1
kill -TERM "$daemon"
wait "$daemon"
note "daemon exit $?"
note "setters refused: $(wc -l <"$OUT/setters.jsonl")"
