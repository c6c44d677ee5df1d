#!/usr/bin/env bash
# Traffic classes on the testbed: a terminal of 10 Mb/s (the geo profile, its forward rate
# set to 10 Mb/s), a stream the server paces at 4 Mb/s to a client socket marking AF41,
# beside 8 bulk downloads to client sockets marking CS1, all read for SECONDS. Settings,
# interleaved run by run (repeats outermost) so a busy spell hits them alike:
#   plain     end-to-end CUBIC, no pepd
#   pepd      pepd without classes (every flow alike)
#   classes   pepd with a class on the hub that serves AF41 ahead of the rest, capped at
#             5 Mb/s:  [[class]] name = "video", dscp = ["AF41"], priority = true,
#             max_rate = "5Mbit"
# Over each run's window (after its first sixth) it reports the stream's goodput, the bulk
# flows' goodput, and how much of the link the window used (the emulator's delivered bytes
# against the link rate). The summary (median, min, max per setting, and the acceptance:
# stream >= 3.9 Mb/s and link use >= 0.95 with classes) is printed as JSON.
# Usage: cargo build --release -p pepd -p pep-testbed && ./scripts/bench-classes.sh
# Environment: RUNS (5), SECONDS (30), OUT (target/bench/classes-runs.jsonl).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-testbed.sh
bin="${CARGO_TARGET_DIR:-target}/release"
TB="$bin/pep-testbed"
export PEPD_BIN=${PEPD_BIN:-$bin/pepd}
RUNS=${RUNS:-5}
SECONDS_EACH=${SECONDS:-30}
out=${OUT:-target/bench/classes-runs.jsonl}
mkdir -p "$(dirname "$out")"
: >"$out"
class='[[class]]
name = "video"
dscp = ["AF41"]
priority = true
max_rate = "5Mbit"'
common=(--profile geo --rate-bps 10e6 --workload classes --flows 8 --stream-bps 4e6
    --stream-dscp 34 --bulk-dscp 8 --seconds "$SECONDS_EACH"
    --max-seconds "$((SECONDS_EACH * 2 + 30))" --timeline --json)
for run in $(seq 1 "$RUNS"); do
    for setting in plain pepd classes; do
        case $setting in
            plain) args=(--mode plain-cubic) ;;
            pepd) args=(--mode pepd) ;;
            classes) args=(--mode pepd --pepd-hub-toml "$class") ;;
        esac
        line=$("$TB" run "${common[@]}" "${args[@]}" --traffic-seed "$run")
        python3 -c 'import json,sys; r=json.loads(sys.argv[1]); r["setting"]=sys.argv[2]; r["run"]=int(sys.argv[3]); print(json.dumps(r))' \
            "$line" "$setting" "$run" >>"$out"
        echo "  run $run $setting done" >&2
    done
done
python3 - "$out" "$SECONDS_EACH" <<'PY'
import json, statistics, sys
seconds = float(sys.argv[2])
by = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    # The window the client measured: from a sixth of the run to its end, in emulator time.
    start = r["workload_start_s"] + seconds / 6
    end = r["workload_start_s"] + seconds
    # The emulator's timeline is in buckets of 0.1 s, each named by its start.
    window = [b for b in r["timeline"] if start <= b["t"] < end]
    delivered = sum(b["delivered_bytes"] for b in window)
    use = delivered * 8 / (len(window) * 0.1 * r["forward"]["rate_bps"])
    c = r["classes"]
    by.setdefault(r["setting"], []).append({
        "stream_mbps": c["stream_bps"] / 1e6,
        "bulk_mbps": c["bulk_bps"] / 1e6,
        "link_use": use,
        "exact": r["intact"] is True and r["error"] is None,
    })
def cell(xs):
    return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3), "max": round(max(xs), 3)}
summary = {}
for setting, rs in by.items():
    summary[setting] = {k: cell([x[k] for x in rs]) for k in ("stream_mbps", "bulk_mbps", "link_use")}
    summary[setting]["runs"] = len(rs)
    summary[setting]["all_exact"] = all(x["exact"] for x in rs)
if "classes" in by:
    rs = by["classes"]
    summary["acceptance"] = {
        "stream_at_least_3.9_mbps_every_run": all(x["stream_mbps"] >= 3.9 for x in rs),
        "link_use_at_least_0.95_every_run": all(x["link_use"] >= 0.95 for x in rs),
    }
print(json.dumps(summary, indent=1))
PY
