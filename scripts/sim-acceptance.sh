#!/usr/bin/env bash
# Runs every simulator acceptance scenario of the transport (issue 2) in release mode and
# checks each against its target. Prints one line per check: PASS/FAIL, the figure, the
# command. Exit status is non-zero if any check fails. Used to produce docs/BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p pep-sim
SIM="${CARGO_TARGET_DIR:-target}/release/pep-sim"
fails=0

# check NAME PYTHON_EXPR_ON_r PRINT_EXPR -- ARGS...
check() {
    local name=$1 cond=$2 show=$3
    shift 4
    local json
    json=$("$SIM" bulk "$@" --json)
    local verdict
    verdict=$(python3 -c "
import json,sys
r=json.loads(sys.argv[1])
ok = bool($cond)
print(('PASS' if ok else 'FAIL') + '\t' + str($show))
" "$json")
    printf '%s\t%s\tpep-sim bulk %s --json\n' "${verdict%%$'\t'*}" "$name: ${verdict#*$'\t'}" "$*"
    [[ $verdict == PASS* ]] || fails=$((fails + 1))
}

eff='"eff=%.3f intact=%s cpu=%.2fs" % (r["efficiency"], r["intact"], r["cpu_seconds"])'
for ber in 0 1e-8 1e-7 1e-6 1e-5; do
    check "lawson ber=$ber efficiency>=0.95" 'r["efficiency"]>=0.95 and r["intact"]' "$eff" -- \
        --rate-bps 1544000 --delay-ms 285 --ber "$ber" --seconds 300 --cc rate --loss-default corruption
done
check "lawson ber=1e-5 cpu<2s" 'r["cpu_seconds"]<2.0' "$eff" -- \
    --rate-bps 1544000 --delay-ms 285 --ber 1e-5 --seconds 300 --cc rate

comp='"completion=%.3fs t_min=%.3fs ratio=%.4f intact=%s" % (r["completion_s"] or -1, r["t_min_s"], r["completion_over_t_min"] or 99, r["intact"])'
for ber in 0 1e-7 1e-5; do
    for seed in 1 2 3; do
        check "nasa ber=$ber seed=$seed completion<=1.12*T_min" \
            'r["completion_over_t_min"] is not None and r["completion_over_t_min"]<=1.12 and r["intact"]' "$comp" -- \
            --rate-bps 100000000 --delay-ms 250 --ber "$ber" --bytes 100000000 --seed "$seed"
    done
done

vg='"util=%.3f eff=%.3f qdelay=%.1fms jain=%.4f losses=%s true=%s" % (r["link_utilisation"], r["efficiency"], r["mean_queue_delay_ms"], r["jain_fairness"] or 1, r["losses_by_cause"], {k:v for k,v in r["losses_true"].items() if v})'
check "vegas 3 assoc shared 15M util>=0.9" 'r["link_utilisation"]>=0.9 and r["intact"]' "$vg" -- \
    --rate-bps 15000000 --delay-ms 250 --seconds 120 --associations 3 --cc vegas --queue-bytes 200000
check "vegas 3 assoc shared 15M ber=1e-6 efficiency>=0.9" 'r["efficiency"]>=0.9 and r["intact"]' "$vg" -- \
    --rate-bps 15000000 --delay-ms 250 --seconds 120 --associations 3 --cc vegas --queue-bytes 200000 --ber 1e-6 --loss-default corruption

share='(lambda l: "corruption=%.3f congestion=%.3f n=%d" % (l["corruption"]/max(1,sum(l.values())), l["congestion"]/max(1,sum(l.values())), sum(l.values())))(r["losses_by_cause"])'
corr='(lambda l: l["corruption"]/max(1,sum(l.values())))(r["losses_by_cause"])'
cong='(lambda l: l["congestion"]/max(1,sum(l.values())))(r["losses_by_cause"])'
check "classify: random corruption (vegas, 1 assoc, 1e-5) >=95% corruption" "$corr>=0.95" "$share" -- \
    --rate-bps 15000000 --delay-ms 250 --ber 1e-5 --seconds 120 --cc vegas
check "classify: random corruption (vegas, 3 assoc, 1e-6) >=95% corruption" "$corr>=0.95" "$share" -- \
    --rate-bps 15000000 --delay-ms 250 --ber 1e-6 --seconds 120 --cc vegas --associations 3
check "classify: queue overflow (rate 20M into 15M) >=90% congestion" "$cong>=0.90" "$share" -- \
    --rate-bps 15000000 --cc-rate-bps 20000000 --delay-ms 250 --seconds 120 --cc rate --queue-bytes 200000
check "classify: queue overflow (vegas 3 assoc, 100 KB queue) >=90% congestion" "$cong>=0.90" "$share" -- \
    --rate-bps 15000000 --delay-ms 250 --seconds 120 --associations 3 --cc vegas --queue-bytes 100000

out='"intact=%s resets=%d resume_after_link_back=%s s events=%s eff=%.3f" % (r["intact"], r["flow_resets"], r["outage_resume_s"], r["outage_events"], r["efficiency"])'
# Bound: 2 RTT (1.14 s) + one probe interval (1 s).
check "outage 60 s mid 200 s: intact, no reset, resume <= 2 RTT + probe interval" \
    'r["intact"] and r["flow_resets"]==0 and all(x is not None and x<=2*0.57+1.0 for x in r["outage_resume_s"])' "$out" -- \
    --rate-bps 1544000 --delay-ms 285 --seconds 200 --outage 70+60

fair='"jain=%.5f eff=%.3f" % (r["jain_fairness"], r["efficiency"])'
check "fairness 20 flows jain>=0.98" 'r["jain_fairness"]>=0.98 and r["intact"]' "$fair" -- \
    --rate-bps 1544000 --delay-ms 285 --seconds 300 --flows 20
check "fairness 20 flows ber=1e-5 jain>=0.98" 'r["jain_fairness"]>=0.98 and r["intact"]' "$fair" -- \
    --rate-bps 1544000 --delay-ms 285 --seconds 300 --flows 20 --ber 1e-5

ret='"return/forward=%.4f eff=%.3f" % (r["return_over_forward"], r["efficiency"])'
check "return bytes <=1.5% of forward at ber 0 (lawson)" 'r["return_over_forward"]<=0.015' "$ret" -- \
    --rate-bps 1544000 --delay-ms 285 --seconds 300
check "return bytes <=1.5% of forward at ber 0 (nasa)" 'r["return_over_forward"]<=0.015' "$ret" -- \
    --rate-bps 100000000 --delay-ms 250 --bytes 100000000
check "return link 1/50 of forward: efficiency>=0.95" 'r["efficiency"]>=0.95 and r["intact"]' "$ret" -- \
    --rate-bps 10000000 --return-rate-bps 200000 --delay-ms 250 --seconds 120
check "return link 1/50 of forward (lawson): efficiency>=0.95" 'r["efficiency"]>=0.95 and r["intact"]' "$ret" -- \
    --rate-bps 1544000 --return-rate-bps 30880 --delay-ms 285 --seconds 300

echo "failed checks: $fails"
exit $((fails > 0))
