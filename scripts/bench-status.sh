#!/usr/bin/env bash
# `pepd status` on a hub configured with 1,000 peers (3 terminals associated, the rest
# absent), from the ignored test `bench_status_of_a_hub_of_1000_peers` in tests/hub.rs:
#  - how long an answer takes: `pepd status --json` and the table sorted by RTT as processes
#    (what an operator waits for) and the request alone, PEPD_BENCH_SAMPLES (50) of each;
#  - whether a download through terminal 1's emulated link (PEPD_BENCH_RATE bit/s,
#    PEPD_BENCH_DELAY_MS one way) keeps its goodput while `pepd status --watch 0.1` asks
#    ten times a second: PEPD_BENCH_RUNS (3) runs without and with, in turns, each
#    PEPD_BENCH_SECONDS (10) long, the first 2 s left out.
# Goodput needs an idle machine. Needs root. Usage: ./scripts/bench-status.sh
# Writes the JSON lines to OUT (target/bench/status.jsonl) and prints a summary.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-testbed.sh
out=${OUT:-target/bench/status.jsonl}
mkdir -p "$(dirname "$out")"
cargo test --release -p pepd --test hub --no-run
cargo test --release -p pepd --test hub -- --ignored --exact bench_status_of_a_hub_of_1000_peers \
    --nocapture --test-threads 1 | sed -n 's/^BENCH //p' > "$out"
python3 - "$out" <<'PY'
import json, sys
rows = {json.loads(l)["bench"]: json.loads(l) for l in open(sys.argv[1])}
lat = rows["status-latency"]
def ms(s):
    return f"mean {s['mean']} ms, sd {s['sd']}, median {s['median']}, max {s['max']} (n={s['n']})"
print(f"{lat['peers']} peers ({lat['established']} established), answer {lat['answer_bytes']} bytes of JSON")
print(f"  pepd status --json (process):       {ms(lat['process_ms'])}")
print(f"  pepd status --sort rtt (process):   {ms(lat['text_process_ms'])}")
print(f"  the request alone:                  {ms(lat['request_ms'])}")
g = rows["status-watch-goodput"]
def mbps(s):
    return f"mean {s['mean']} Mbit/s, sd {s['sd']}, {s['min']}–{s['max']} (n={s['n']})"
print(f"download over {g['link_mbps']} Mbit/s, {g['one_way_ms']} ms one way, {g['seconds']} s runs:")
print(f"  without a watcher:             {mbps(g['idle'])}")
print(f"  with pepd status --watch 0.1:  {mbps(g['watched'])}")
print(f"  answers a second while watching: {', '.join('%.1f' % r for r in g['watch_answers_per_second'])}")
PY
