#!/usr/bin/env bash
# Testbed benchmarks for links that do not hold still (capacity tracking) and noisy links (the
# datagram size that follows the error rate, cell `noisy`). Each cell runs pepd (the default
# `cc = "adaptive"`) beside plain end-to-end CUBIC and BBR on the same emulated link,
# RUNS times (default 3), and prints mean and spread with a PASS/FAIL verdict against the
# acceptance bounds. Every run's JSON line goes to $OUT (default bench-capacity.jsonl).
# Needs root (namespaces). Usage:
#   cargo build --release -p pepd -p pep-testbed && ./scripts/bench-capacity.sh
#   CELLS="fade acm" RUNS=1 ./scripts/bench-capacity.sh
#   PEPD_ONLY=1 ./scripts/bench-capacity.sh    # pepd's variants only (no plain CUBIC / BBR)
#   CELLS=jitter ./scripts/bench-capacity.sh   # a link with jitter (not in the default cells):
#       JITTER_PROFILE geo (default: 50 MB) or leo (250 MB; "without jitter" sets the
#       profile's own 5 ms to 0 too), JITTER_KINDS (default "uniform wander slotted"),
#       JITTER_MS (default 20), JITTER_ACM=1 for the ACM steps (geo 20->7->20 Mb/s, leo
#       100->40->100, every 10 s), JITTER_MODES (default "pepd plain-cubic plain-bbr");
#       each kind beside the same link without jitter
#   APPEND=1 keeps the runs already in $OUT (to add variants to a set, then judge them all)
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-testbed.sh
bin="${CARGO_TARGET_DIR:-target}/release"
TB="$bin/pep-testbed"
export PEPD_BIN=${PEPD_BIN:-$bin/pepd}
RUNS=${RUNS:-3}
OUT=${OUT:-bench-capacity.jsonl}
CELLS=${CELLS:-"fade acm udp tcp leo nodelay lawson noisy"}
[[ ${APPEND:-0} == 1 ]] || : >"$OUT"

# run CELL VARIANT ARGS...: RUNS runs of `pep-testbed run ARGS --json`, each line tagged.
run() {
    local cell=$1 variant=$2
    shift 2
    if [[ ${PEPD_ONLY:-0} == 1 && $variant != pepd* && $variant != adaptive* && $variant != rate-* ]]; then
        return
    fi
    for i in $(seq 1 "$RUNS"); do
        local line
        line=$("$TB" run "$@" --traffic-seed "$i" --json)
        python3 -c 'import json,sys; r=json.loads(sys.argv[1]); r["cell"]=sys.argv[2]; r["variant"]=sys.argv[3]; r["command"]=sys.argv[4]; print(json.dumps(r))' \
            "$line" "$cell" "$variant" "pep-testbed run $*" >>"$OUT"
        echo "  $cell/$variant run $i done" >&2
    done
}

geo_fade=(--profile geo --rate-bps 10e6 --return-rate-bps 2e6 --settle-s 2 --max-seconds 200)
interactive=(--workload interactive --request-bytes 1000 --response-bytes 1000 --interval-ms 200)
for cell in $CELLS; do
    echo "cell $cell" >&2
    case $cell in
    fade)
        run fade pepd-20M "${geo_fade[@]}" --mode pepd --pepd-forward-rate 20Mbit "${interactive[@]}" --bytes 50000000
        run fade pepd-10M "${geo_fade[@]}" --mode pepd "${interactive[@]}" --bytes 50000000
        run fade cubic "${geo_fade[@]}" --mode plain-cubic "${interactive[@]}" --bytes 50000000
        run fade bbr "${geo_fade[@]}" --mode plain-bbr "${interactive[@]}" --bytes 50000000
        ;;
    acm)
        for mode in pepd plain-cubic plain-bbr; do
            run acm "$mode" --profile geo --rate-schedule 0:20M,30:10M,60:5M,90:20M --settle-s 2 \
                --mode "$mode" "${interactive[@]}" --seconds 120 --max-seconds 200
        done
        ;;
    udp)
        for mode in pepd plain-cubic plain-bbr; do
            run udp "$mode" --profile geo --cross-udp-bps 5e6 --settle-s 2 --mode "$mode" \
                --workload download --seconds 60 --max-seconds 120
        done
        ;;
    tcp)
        for mode in pepd plain-cubic plain-bbr; do
            run tcp "$mode" --profile geo --cross-tcp-seconds 60 --settle-s 2 --mode "$mode" \
                --workload download --seconds 60 --max-seconds 120
        done
        ;;
    leo)
        run leo pepd --profile leo --settle-s 2 --mode pepd --workload download --seconds 60 --max-seconds 120
        run leo pepd-rate --profile leo --settle-s 2 --mode pepd --pepd-toml '[transport] cc = "rate"' \
            --workload download --seconds 60 --max-seconds 120
        run leo cubic --profile leo --settle-s 2 --mode plain-cubic --workload download --seconds 60 --max-seconds 120
        run leo bbr --profile leo --settle-s 2 --mode plain-bbr --workload download --seconds 60 --max-seconds 120
        ;;
    nodelay)
        nd=(--profile nasa --delay-ms 0 --rate-bps 10e9 --mode pepd --workload download --bytes 1000000000 --max-seconds 120)
        run nodelay adaptive-2G "${nd[@]}" --pepd-toml '[link] tx_rate = "2Gbit"' --pepd-toml '[link] rx_rate = "2Gbit"'
        run nodelay rate-1G "${nd[@]}" --pepd-toml '[link] tx_rate = "1Gbit"' --pepd-toml '[link] rx_rate = "1Gbit"' \
            --pepd-toml '[transport] cc = "rate"'
        ;;
    lawson)
        for ber in 0 1e-5; do
            run lawson "pepd-ber-$ber" --profile lawson --ber "$ber" --mode pepd --workload download --seconds 60 --max-seconds 120
        done
        ;;
    jitter)
        # A download beside a 1 KB request every 200 ms, the emulator's jitter
        # (crates/sim/src/jitter.rs, the simulator's model) on both directions.
        if [[ ${JITTER_PROFILE:-geo} == leo ]]; then
            link_jitter=(--profile leo --bytes 250000000)
            acm_steps=0:100M,10:40M,20:100M,30:40M,40:100M,50:40M
        else
            link_jitter=(--profile geo --bytes 50000000)
            acm_steps=0:20M,10:7M,20:20M,30:7M,40:20M,50:7M
        fi
        link_jitter+=(--settle-s 2 --max-seconds 300 "${interactive[@]}")
        if [[ ${JITTER_ACM:-0} == 1 ]]; then
            link_jitter+=(--rate-schedule "$acm_steps")
        fi
        for kind in none ${JITTER_KINDS:-uniform wander slotted}; do
            jitter_args=(--jitter-ms 0)
            if [[ $kind != none ]]; then
                jitter_args=(--jitter-ms "${JITTER_MS:-20}" --jitter-kind "$kind")
            fi
            for mode in ${JITTER_MODES:-pepd plain-cubic plain-bbr}; do
                run "jitter-$kind" "$mode" "${link_jitter[@]}" "${jitter_args[@]}" --mode "$mode"
            done
        done
        ;;
    noisy)
        # lawson at BER 1e-4, where the datagram size follows the error rate.
        for mode in pepd plain-cubic plain-bbr; do
            run noisy "$mode" --profile lawson --ber 1e-4 --mode "$mode" --workload download --seconds 60 --max-seconds 120
        done
        ;;
    *)
        echo "unknown cell $cell" >&2
        exit 2
        ;;
    esac
done

python3 - "$OUT" <<'PY'
import json, statistics, sys

runs = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in runs:
    by.setdefault((r["cell"], r["variant"]), []).append(r)

def p(v, q):
    v = sorted(v)
    return v[round((len(v) - 1) * q)] if v else float("nan")

def stat(xs, fmt="{:.3f}"):
    if not xs:
        return "-"
    m = statistics.mean(xs)
    return (fmt + " [" + fmt + "–" + fmt + "]").format(m, min(xs), max(xs))

fails = 0
def verdict(name, ok, detail):
    global fails
    print(("PASS" if ok else "FAIL") + "\t" + name + "\t" + detail)
    fails += 0 if ok else 1

def intact(rs):
    return all(r["intact"] is True and not r["error"] for r in rs)

def show(cell, key, label, fmt="{:.3f}"):
    for (c, v), rs in sorted(by.items()):
        if c == cell:
            print(f"  {cell}/{v}: {label} " + stat([key(r) for r in rs], fmt) + f"  ({len(rs)} runs, intact={intact(rs)})")

if ("fade", "pepd-20M") in by:
    lat99 = lambda r: p(r["latencies_s"], 0.99)
    print("fade: geo, forward link 10 Mb/s; request p99 (s) and 50 MB completion (s), mean [min–max]")
    show("fade", lat99, "request p99 s")
    show("fade", lambda r: r["completion_s"], "completion s", "{:.2f}")
    rs = by[("fade", "pepd-20M")]
    verdict("fade: request p99 <= 0.70 s (pepd provisioned 20M)", intact(rs) and all(lat99(r) <= 0.70 for r in rs),
            stat([lat99(r) for r in rs]))
    if ("fade", "pepd-10M") in by:
        right = statistics.mean(r["completion_s"] for r in by[("fade", "pepd-10M")])
        verdict(f"fade: download <= 1.1 x provisioned right ({right:.2f} s)",
                all(r["completion_s"] <= 1.1 * right for r in rs), stat([r["completion_s"] for r in rs], "{:.2f}"))

if ("acm", "pepd") in by:
    print("acm: geo, 20 -> 10 -> 5 -> 20 Mb/s every 30 s (emulator time); per step (new Mb/s, queue under 100 ms for 2 s from (s), longest queue after that (ms), 0.9 of the new rate reached (s))")
    for (c, v), rs in sorted(by.items()):
        if c != "acm":
            continue
        for r in rs:
            steps = [(s["to_bps"] / 1e6, s["queue_settled_s"], s["later_queue_max_ms"] and round(s["later_queue_max_ms"]), s["reached_s"]) for s in r["step_responses"][1:]]
            print(f"  acm/{v}: goodput {r['goodput_bps']/1e6:.2f} Mb/s, queue p99 {r['emulator']['forward']['queue_delay']['p99_ms']:.0f} ms, steps {steps}")
    rs = by[("acm", "pepd")]
    ok = intact(rs)
    for r in rs:
        for s in r["step_responses"][1:]:
            if s["to_bps"] < s["from_bps"]:
                ok &= s["queue_settled_s"] is not None and s["queue_settled_s"] <= 1.8
            elif s["to_bps"] > s["from_bps"]:
                ok &= s["reached_s"] is not None and s["reached_s"] <= 5.0
    verdict("acm: queue < 100 ms within 3 RTT (1.8 s) of each step down, >= 0.9 of the new rate within 5 s of the step up", ok, "")

if ("udp", "pepd") in by:
    print("udp: geo 20 Mb/s with 5 Mb/s unresponsive UDP; goodput (Mb/s), bottleneck queue p99 (ms)")
    show("udp", lambda r: r["goodput_bps"] / 1e6, "goodput Mb/s", "{:.2f}")
    show("udp", lambda r: r["emulator"]["forward"]["queue_delay"]["p99_ms"], "queue p99 ms", "{:.1f}")
    rs = by[("udp", "pepd")]
    verdict("udp: pepd >= 13.5 Mb/s with queue p99 <= 100 ms",
            intact(rs) and all(r["goodput_bps"] >= 13.5e6 and r["emulator"]["forward"]["queue_delay"]["p99_ms"] <= 100 for r in rs),
            stat([r["goodput_bps"] / 1e6 for r in rs], "{:.2f}"))

if ("tcp", "pepd") in by:
    print("tcp: geo 20 Mb/s beside one plain CUBIC download; goodput of each (Mb/s)")
    show("tcp", lambda r: r["goodput_bps"] / 1e6, "measured flow Mb/s", "{:.2f}")
    show("tcp", lambda r: r["cross"]["tcp"]["goodput_bps"] / 1e6, "competing CUBIC Mb/s", "{:.2f}")
    show("tcp", lambda r: r["emulator"]["forward"]["queue_delay"]["p99_ms"], "queue p99 ms", "{:.0f}")
    rs = by[("tcp", "pepd")]
    verdict("tcp: neither starves (each >= 5 Mb/s, 25 % of the link)",
            intact(rs) and all(r["goodput_bps"] >= 5e6 and r["cross"]["tcp"]["goodput_bps"] >= 5e6 for r in rs), "")

if ("leo", "pepd") in by:
    print("leo: 100/20 Mb/s, delay steps every 15 s with 100-200 ms outages; goodput / (link's average capacity x 1460/1500)")
    show("leo", lambda r: r["efficiency_of_capacity"], "of capacity")
    show("leo", lambda r: r["goodput_bps"] / 1e6, "goodput Mb/s", "{:.1f}")
    rs = by[("leo", "pepd")]
    verdict("leo: >= 0.9 of the link's average capacity, byte-exact",
            intact(rs) and all(r["efficiency_of_capacity"] >= 0.9 for r in rs), stat([r["efficiency_of_capacity"] for r in rs]))

if ("nodelay", "adaptive-2G") in by:
    print("nodelay: 10 Gb/s emulated, no delay, 1 GB; goodput (Gb/s)")
    show("nodelay", lambda r: r["goodput_bps"] / 1e9, "Gb/s")
    a = statistics.mean(r["goodput_bps"] for r in by[("nodelay", "adaptive-2G")])
    if ("nodelay", "rate-1G") in by:
        b = statistics.mean(r["goodput_bps"] for r in by[("nodelay", "rate-1G")])
        verdict(f"nodelay: adaptive at 2 Gbit >= 0.9 x rate at 1 Gbit ({b/1e9:.3f} Gb/s)",
                intact(by[("nodelay", "adaptive-2G")]) and a >= 0.9 * b, f"{a/1e9:.3f} Gb/s = {a/b:.3f}")

for ber in ["0", "1e-5"]:
    k = ("lawson", f"pepd-ber-{ber}")
    if k in by:
        rs = by[k]
        verdict(f"lawson 60 s BER {ber}: efficiency >= 0.95", intact(rs) and all(r["efficiency"] >= 0.95 for r in rs),
                stat([r["efficiency"] for r in rs]))

jitter_cells = sorted({c for (c, v) in by if c.startswith("jitter-") and c != "jitter-none"})
if jitter_cells and ("jitter-none", "pepd") in by:
    # The simulator's jitter rows' bounds (scripts/sim-acceptance.sh), on the testbed.
    import os
    bound_ms = float(os.environ.get("JITTER_MS", "20"))
    lat99 = lambda r: p(r["latencies_s"], 0.99)
    mean = lambda rs, f: statistics.mean(f(r) for r in rs)
    profile = os.environ.get("JITTER_PROFILE", "geo")
    size = {"geo": "50 MB", "leo": "250 MB"}.get(profile, "download")
    print(f"jitter: {profile}, ±{bound_ms:g} ms; request p99 (s) and {size} completion (s), mean [min–max]")
    for cell in ["jitter-none"] + jitter_cells:
        show(cell, lat99, "request p99 s")
        show(cell, lambda r: r["completion_s"], "completion s", "{:.2f}")
    ref = by[("jitter-none", "pepd")]
    for cell in jitter_cells:
        rs = by.get((cell, "pepd"))
        if not rs:
            continue
        ratio = mean(ref, lambda r: r["completion_s"]) / mean(rs, lambda r: r["completion_s"])
        p99, ref_p99 = mean(rs, lat99), mean(ref, lat99)
        limit = ref_p99 + (2 * bound_ms + 20) / 1e3
        verdict(f"{cell}: goodput >= 0.93 x without jitter, request p99 <= {limit:.3f} s",
                intact(rs) and ratio >= 0.93 and p99 <= limit, f"goodput {ratio:.3f} x, p99 {p99:.3f} s")
        bbr = by.get((cell, "plain-bbr"))
        if bbr:
            g = mean(bbr, lambda r: r["completion_s"]) / mean(rs, lambda r: r["completion_s"])
            l = mean(bbr, lat99) / p99
            verdict(f"{cell}: ahead of plain BBR on goodput or p99, behind on neither by > 5 %",
                    (g > 1 or l > 1) and g >= 0.95 and l >= 0.95,
                    f"goodput {g:.3f} x BBR's, p99 {1 / l:.3f} x BBR's")

if ("noisy", "pepd") in by:
    print("noisy: lawson (1.544 Mb/s, 570 ms RTT) at BER 1e-4, 60 s download; goodput (Mb/s), pepd's datagram size")
    show("noisy", lambda r: r["goodput_bps"] / 1e6, "goodput Mb/s")
    rs = by[("noisy", "pepd")]
    verdict("noisy: pepd >= 0.85 Mb/s, byte-exact", intact(rs) and all(r["goodput_bps"] >= 0.85e6 for r in rs),
            stat([r["goodput_bps"] / 1e6 for r in rs]))

print(f"failed: {fails}")
sys.exit(1 if fails else 0)
PY
