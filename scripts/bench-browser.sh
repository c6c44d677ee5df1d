#!/usr/bin/env bash
# The browser workload on the netns testbed (pep-testbed browser): headless chromium loads
# a page of 30 objects (3 MB) from caddy over the geo profile, a first visit and a repeat
# visit (HTTP cache cleared, Alt-Svc kept) per run, in three modes side by side: plain (no
# pepd), pepd with quic = "pass" and pepd with quic = "reject". RUNS (5) runs per mode, the
# modes taking turns so that all meet the same conditions of the machine. Writes into DIR
# (target/bench/browser): runs.jsonl (one object per run), summary.json (median and spread
# per mode and visit, the protocol mix) and prints a table. Needs root; installs caddy,
# chromium and certutil where they are missing. Timing needs an idle machine.
# Usage: ./scripts/bench-browser.sh   (DIR=… RUNS=… PROFILE=… to change)
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-testbed.sh
./scripts/install-browser.sh
dir=${DIR:-target/bench/browser}
runs=${RUNS:-5}
profile=${PROFILE:-geo}
mkdir -p "$dir"
cargo build --release -p pepd -p pep-testbed
./target/release/pep-testbed browser --profile "$profile" --runs "$runs" \
    --mode plain --mode pass --mode reject >"$dir/all.jsonl"
# Every line but the last is a run; the last is the summary.
head -n -1 "$dir/all.jsonl" >"$dir/runs.jsonl"
tail -n 1 "$dir/all.jsonl" >"$dir/summary.json"
rm "$dir/all.jsonl"
python3 - "$dir/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"profile {s['profile']}, {s['runs']} runs in all; load time (navigation start to load event), ms")
print(f"{'mode':8} {'visit':7} {'median':>8} {'min':>8} {'max':>8}  protocols; QUIC sessions' ends")
for mode in ("plain", "pass", "reject"):
    for visit in ("first", "repeat"):
        v = s["modes"].get(mode, {}).get(visit)
        if not v:
            continue
        l = v["load_ms"]
        protos = ", ".join(f"{p} {n}" for p, n in v["protocols"].items())
        ends = ", ".join(f"{e}: {n}" for e, n in v["quic_session_ends"].items()) or "none"
        print(f"{mode:8} {visit:7} {l['median']:8.0f} {l['min']:8.0f} {l['max']:8.0f}  {protos}; {ends}"
              + (f"; {v['failed']} failed requests" if v["failed"] else ""))
for visit, r in s["reject_over_pass"].items():
    print(f"reject / pass, {visit} visit (medians): {r:.2f}")
print(f"every response under reject over TCP: {s['reject_all_tcp']}")
PY
