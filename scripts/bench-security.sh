#!/usr/bin/env bash
# Security benchmarks: pepd with encryption (the default) against `security.mode = "none"`.
#  1. lawson (1.544 Mb/s, 285 ms one way) efficiency at BER 0..1e-5, encrypted;
#  2. one 1 GB flow on a no-delay, no-loss link (10 Gb/s emulated) at tx_rate = rx_rate = 500 Mbit/s, both
#     modes side by side: goodput, and CPU seconds of each gateway's pepd (sampled from
#     /proc every 0.2 s while it runs).
# Needs root. Usage: cargo build --release -p pepd -p pep-testbed && ./scripts/bench-security.sh
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-testbed.sh
bin="${CARGO_TARGET_DIR:-target}/release"
TB="$bin/pep-testbed"
export PEPD_BIN=${PEPD_BIN:-$bin/pepd}
field() { python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print(eval(sys.argv[1]))" "$1"; }

for ber in 0 1e-8 1e-7 1e-6 1e-5; do
  out=$($TB run --profile lawson --mode pepd --ber "$ber" --workload download --bytes 5000000 \
        --max-seconds 120 --json | tail -1)
  echo "lawson encrypted ber=$ber efficiency=$(echo "$out" | field "round(d['efficiency'],3)") intact=$(echo "$out" | field "d['intact']")"
done

# CPU seconds (user+system) of the pepd whose command line names gw-$1.toml.
cpu_of() {
  local pid
  pid=$(pgrep -f "pepd run -c .*gw-$1.toml" | head -1) || return 0
  [ -n "$pid" ] && awk -v hz="$(getconf CLK_TCK)" '{print ($14+$15)/hz}' "/proc/$pid/stat" 2>/dev/null
}
for mode in noise none; do
  toml='[link]
tx_rate = "500Mbit"
rx_rate = "500Mbit"'
  [ "$mode" = none ] && toml="$toml
[security]
mode = \"none\""
  samples=$(mktemp)
  ( while true; do echo "$(cpu_of a) $(cpu_of b)" >> "$samples"; sleep 0.2; done ) &
  sampler=$!
  out=$($TB run --profile nasa --rate-bps 10000000000 --delay-ms 0 --mode pepd --pepd-toml "$toml" \
        --workload download --bytes 1000000000 --max-seconds 120 --json | tail -1)
  kill "$sampler"; wait "$sampler" 2>/dev/null || true
  # The last complete sample before the daemons stopped.
  last=$(awk 'NF==2' "$samples" | tail -1); rm -f "$samples"
  secs=$(echo "$out" | field "round(d['completion_s'],2)")
  echo "no-delay 1 GB security=$mode goodput=$(echo "$out" | field "round(d['goodput_bps']/1e6,1)")Mb/s time=${secs}s intact=$(echo "$out" | field "d['intact']") cpu_s(gw-a receiver, gw-b sender)=${last}"
done
