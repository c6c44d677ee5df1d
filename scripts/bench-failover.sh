#!/usr/bin/env bash
# Failover of a hub on the netns testbed (pep-testbed failover): for each scenario in
# SCENARIOS (restart standby-pepd standby-hub active-set), RUNS (5) runs on the geo
# profile, each terminal probing through pepd every 200 ms: 8 terminals, and for
# active-set 3 hubs and 12 terminals (4 homed on each). The first run of each scenario
# also runs its control (the same without the failure); every active-set run does, for
# the unaffected terminals' p99 beside it. Prints per scenario the worst and median of the
# runs' worst terminal recovery, the flows reset and hung, whether every answer was exact,
# and for active-set the unaffected terminals' resets and p99 against the control's.
# Needs root; installs keepalived for the standby scenarios and FRR for active-set where
# they are missing. Timing needs an idle machine.
# Usage: ./scripts/bench-failover.sh   (writes the JSON lines to OUT, target/bench/failover.jsonl)
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-testbed.sh
./scripts/install-keepalived.sh
./scripts/install-frr.sh
out=${OUT:-target/bench/failover.jsonl}
runs=${RUNS:-5}
scenarios=${SCENARIOS:-restart standby-pepd standby-hub active-set}
mkdir -p "$(dirname "$out")"
: >"$out"
cargo build --release -p pepd -p pep-testbed
for s in $scenarios; do
    for r in $(seq 1 "$runs"); do
        extra=()
        [ "$r" = 1 ] && extra=(--control)
        [ "$s" = active-set ] && extra=(--control --hubs 3 --terminals 12)
        ./target/release/pep-testbed failover --scenario "$s" "${extra[@]}" --json >>"$out"
    done
done
python3 - "$out" <<'PY'
import json, statistics, sys
by = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    by.setdefault(r["scenario"], []).append(r)
for s, rs in by.items():
    worst = [r["recovery_s"]["max"] for r in rs]
    done = [w for w in worst if w is not None]
    print(f"{s}: {len(rs)} runs, {len(rs[0]['per_terminal'])} terminals")
    if done:
        print(f"  recovery_s (worst terminal of a run): worst {max(done):.2f}, median {statistics.median(done):.2f}"
              + (f"; {len(worst) - len(done)} runs with a terminal never answered again" if len(done) < len(worst) else ""))
    else:
        print("  no run in which every terminal was answered again")
    print(f"  reset_flows {[r['reset_flows'] for r in rs]}, hung_flows {[r['hung_flows'] for r in rs]}, "
          f"all_exact {all(r['all_exact'] for r in rs)}")
    un = [r["unaffected"] for r in rs if r["unaffected"]["terminals"]]
    if un:
        gap = [u["request_p99_s_max"] - u["control_p99_s_max"] for u in un
               if u["request_p99_s_max"] is not None and u["control_p99_s_max"] is not None]
        print(f"  unaffected terminals {un[0]['terminals']}: resets {[u['resets'] for u in un]}, "
              f"request p99 (s) {[u['request_p99_s_max'] for u in un]}, "
              f"control p99 (s) {[u['control_p99_s_max'] for u in un]}, "
              f"largest p99 - control {max(gap) * 1e3 if gap else float('nan'):.0f} ms")
        routed = [r.get("routes_moved_after_s") for r in rs]
        print(f"  routes moved after (s): {routed}")
    moved = [r.get("address_moved_after_s") for r in rs if r.get("address_moved_after_s") is not None]
    if moved:
        print(f"  address moved after (s): {moved}; spurious transitions {[r['spurious_transitions'] for r in rs]}")
PY
