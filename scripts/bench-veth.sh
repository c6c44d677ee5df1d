#!/usr/bin/env bash
# Gigabit baseline: one flow on the direct veth link between the gateways (no emulator),
# plain kernel TCP, the kernel split-TCP relay and pepd without and with encryption, runs
# interleaved (repeats outermost) so a busy spell on a shared machine hits every mode alike.
# Reports goodput and the gateway processes' CPU seconds per GB: mean, sd, min-max.
# Needs root. Usage: cargo build --release -p pepd -p pep-testbed && ./scripts/bench-veth.sh
# Environment: RUNS (3), BYTES (1000000000), RATE (pepd's tx_rate = rx_rate, bit/s; 1e9).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-testbed.sh
bin="${CARGO_TARGET_DIR:-target}/release"
TB="$bin/pep-testbed"
export PEPD_BIN=${PEPD_BIN:-$bin/pepd}
RUNS=${RUNS:-3}
BYTES=${BYTES:-1000000000}
RATE=${RATE:-1e9}
out=${OUT:-target/bench/veth-runs.jsonl}
mkdir -p "$(dirname "$out")"
: > "$out"
for run in $(seq 1 "$RUNS"); do
  for mode in plain-cubic split-tcp pepd-none pepd-noise; do
    case $mode in
      pepd-none) args=(--mode pepd --pepd-security none) ;;
      pepd-noise) args=(--mode pepd --pepd-security noise) ;;
      *) args=(--mode "$mode") ;;
    esac
    line=$($TB run --profile nasa --link veth --rate-bps "$RATE" --delay-ms 0 "${args[@]}" \
           --workload download --bytes "$BYTES" --traffic-seed "$run" --max-seconds 300 --json)
    echo "{\"label\":\"$mode\",\"result\":$line}" >> "$out"
    echo "$line" | python3 -c "import json,sys; r=json.load(sys.stdin); c=r.get('gateway_cpu') or {}; \
print('$mode run $run: %.3f Gb/s intact=%s cpu/GB=%s' % (r['goodput_bps']/1e9, r['intact'], c.get('cpu_s_per_gb')))"
  done
done
python3 - "$out" <<'PY'
import json, statistics, sys
rows = {}
for l in open(sys.argv[1]):
    d = json.loads(l)
    rows.setdefault(d["label"], []).append(d["result"])
def stat(v):
    sd = statistics.stdev(v) if len(v) > 1 else 0.0
    return f"{statistics.mean(v):.3g} ± {sd:.2g} ({min(v):.3g}–{max(v):.3g})"
print("| mode | goodput Gb/s | CPU-s per GB, both gateways | gw-a CPU s | gw-b CPU s | intact |")
print("|---|---|---|---|---|---|")
for label, rs in rows.items():
    g = [r["goodput_bps"] / 1e9 for r in rs]
    cpu = [r["gateway_cpu"] for r in rs if r.get("gateway_cpu")]
    per_gb = stat([c["cpu_s_per_gb"] for c in cpu]) if cpu else "–"
    side = lambda n: stat([c["processes"][n]["total_s"] for c in cpu]) if cpu else "–"
    ok = all(r["intact"] for r in rs)
    print(f"| {label} | {stat(g)} | {per_gb} | {side('gw-a')} | {side('gw-b')} | {ok} |")
PY
