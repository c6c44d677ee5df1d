#!/usr/bin/env bash
# Payload compression's acceptance cells through pepd, compression on (`transport.compression
# = "auto"` on both gateways) beside off, runs interleaved (repeats outermost) so a busy spell
# on a shared machine hits both alike. Each run's result goes to $OUT as one JSON line; the
# summary (mean, sd, min, max per cell and setting, and the acceptance bounds computed from
# them) is printed as one JSON object on stdout. Needs root (namespaces). Cells:
#   lawson-text        Lawson link (1.544 Mb/s, 570 ms RTT), download of the text corpus:
#                      goodput against 0.7 x link rate x the corpus's offline ratio and
#                      2.5 x link rate; byte-exact
#   lawson-random      same link, seeded random bytes: hop bytes on / off (<= 1.005) and
#   lawson-compressed  the text corpus gzipped:      goodput on against off
#   veth-random        no-delay veth, random bytes: CPU seconds per GB of both gateways,
#                      on / off (<= 1.05)
#   veth-text          no-delay veth, text: what compression costs and gains there
# Usage: cargo build --release -p pepd -p pep-testbed && ./scripts/bench-compression.sh
# Environment: RUNS (3), CELLS (all of the above, space-separated), LAWSON_BYTES (20000000),
# VETH_BYTES (1000000000), OUT (target/bench/compression-runs.jsonl).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-testbed.sh
bin="${CARGO_TARGET_DIR:-target}/release"
TB="$bin/pep-testbed"
export PEPD_BIN=${PEPD_BIN:-$bin/pepd}
RUNS=${RUNS:-3}
CELLS=${CELLS:-lawson-text lawson-random lawson-compressed veth-random veth-text}
LAWSON_BYTES=${LAWSON_BYTES:-20000000}
VETH_BYTES=${VETH_BYTES:-1000000000}
out=${OUT:-target/bench/compression-runs.jsonl}
mkdir -p "$(dirname "$out")"
: > "$out"

for run in $(seq 1 "$RUNS"); do
  for cell in $CELLS; do
    case $cell in
      lawson-*) link=(--profile lawson); bytes=$LAWSON_BYTES; limit=600 ;;
      veth-*) link=(--profile nasa --link veth --rate-bps 1e9 --delay-ms 0); bytes=$VETH_BYTES; limit=300 ;;
      *) echo "unknown cell $cell" >&2; exit 2 ;;
    esac
    content=${cell#*-}
    for setting in off auto; do
      line=$($TB run "${link[@]}" --mode pepd --pepd-toml "[transport] compression = \"$setting\"" \
             --workload download --bytes "$bytes" --content "$content" --traffic-seed "$run" \
             --max-seconds "$limit" --json | tail -1)
      echo "{\"cell\":\"$cell\",\"compression\":\"$setting\",\"run\":$run,\"result\":$line}" >> "$out"
      echo "$line" | python3 -c "import json,sys; r=json.load(sys.stdin); c=r.get('gateway_cpu') or {}; \
h=sum(g['wire_bytes_sent'] for g in (r.get('pepd_compression') or {}).values()); \
print('$cell $setting run $run: %.3f Mb/s intact=%s hop=%d B cpu/GB=%s ratio=%.2f' % \
(r['goodput_bps']/1e6, r['intact'], h, c.get('cpu_s_per_gb'), r['content_ratio']))" >&2
    done
  done
done

python3 - "$out" <<'PY'
import json, statistics, sys

LINK_BPS = 1_544_000
rows = {}
for l in open(sys.argv[1]):
    d = json.loads(l)
    rows.setdefault(d["cell"], {}).setdefault(d["compression"], []).append(d["result"])

def stat(v):
    v = [x for x in v if x is not None]
    if not v:
        return None
    return {
        "mean": statistics.mean(v),
        "sd": statistics.stdev(v) if len(v) > 1 else 0.0,
        "min": min(v),
        "max": max(v),
        "n": len(v),
    }

def hop_bytes(r):
    # Datagram bytes both gateways sent on the hop, both directions, over the daemons' life.
    return sum(g["wire_bytes_sent"] for g in (r.get("pepd_compression") or {}).values()) or None

def cpu_per_gb(r):
    return (r.get("gateway_cpu") or {}).get("cpu_s_per_gb")

def sent_by(r, gw, key):
    return ((r.get("pepd_compression") or {}).get(gw) or {}).get(key)

summary = {"runs_per_setting": None, "cells": {}}
for cell, by in rows.items():
    c = {}
    for setting, rs in by.items():
        summary["runs_per_setting"] = len(rs)
        c[setting] = {
            "goodput_bps": stat([r["goodput_bps"] for r in rs]),
            "completion_s": stat([r.get("completion_s") for r in rs]),
            "hop_bytes": stat([hop_bytes(r) for r in rs]),
            "cpu_s_per_gb": stat([cpu_per_gb(r) for r in rs]),
            # The hub (gw-b) sends the download: its application bytes and blocks.
            "hub_plain_sent": stat([sent_by(r, "gw-b", "plain_sent") for r in rs]),
            "hub_blocks_sent": stat([sent_by(r, "gw-b", "blocks_sent") for r in rs]),
            "hub_blocks_by_level": {
                k: stat([sent_by(r, "gw-b", "blocks_" + k) for r in rs])
                for k in ("raw", "fast", "hard")
            },
            "compress_cpu_s": stat([sent_by(r, "gw-b", "compress_cpu_s") for r in rs]),
            "decompress_cpu_s": stat([sent_by(r, "gw-a", "decompress_cpu_s") for r in rs]),
            "intact": all(r["intact"] for r in rs),
        }
    ratio = [r["content_ratio"] for rs in by.values() for r in rs]
    c["content_ratio"] = ratio[0] if ratio else None
    on, off = c.get("auto"), c.get("off")
    checks = {}
    if on and off:
        if cell == "lawson-text" and on["goodput_bps"]:
            g = on["goodput_bps"]["mean"]
            checks["goodput_over_link_rate"] = g / LINK_BPS
            checks["goodput_ge_0.7_x_link_x_ratio"] = g >= 0.7 * LINK_BPS * c["content_ratio"]
            checks["goodput_ge_2.5_x_link"] = g >= 2.5 * LINK_BPS
            checks["intact"] = on["intact"]
        if cell in ("lawson-random", "lawson-compressed") and on["hop_bytes"] and off["hop_bytes"]:
            h = on["hop_bytes"]["mean"] / off["hop_bytes"]["mean"]
            checks["hop_bytes_on_over_off"] = h
            checks["hop_bytes_le_1.005"] = h <= 1.005
            go, gf = on["goodput_bps"], off["goodput_bps"]
            checks["goodput_on_minus_off_bps"] = go["mean"] - gf["mean"]
            # Within the run-to-run spread of off: inside off's min-max widened by its sd
            # (null with one run of off: no spread to be within).
            checks["goodput_within_off_spread"] = (
                gf["min"] - gf["sd"] <= go["mean"] <= gf["max"] + gf["sd"]
                if gf["n"] > 1
                else None
            )
        if cell.startswith("veth-") and on["cpu_s_per_gb"] and off["cpu_s_per_gb"]:
            r = on["cpu_s_per_gb"]["mean"] / off["cpu_s_per_gb"]["mean"]
            checks["cpu_per_gb_on_over_off"] = r
            if cell == "veth-random":
                checks["cpu_per_gb_within_5pct"] = r <= 1.05
            checks["goodput_on_over_off"] = on["goodput_bps"]["mean"] / off["goodput_bps"]["mean"]
    c["checks"] = checks
    summary["cells"][cell] = c
print(json.dumps(summary, indent=1))
PY
