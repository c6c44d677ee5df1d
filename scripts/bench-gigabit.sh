#!/usr/bin/env bash
# The gigabit comparisons, each in one run with the base commit's pepd beside the new
# one, runs interleaved (repeats outermost) so a busy spell on a shared machine hits every row
# alike. One encrypted (unless the row says otherwise) 1 GB download per run.
#   nodelay: the emulated no-delay path (nasa profile, --delay-ms 0, 10 Gb/s), with the
#            emulator's UDP offload and without it (--per-packet-emulation).
#   veth:    the gateways joined by a bare veth pair: plain TCP, the kernel split-TCP relay,
#            pepd without and with encryption.
# Needs root. Usage:
#   cargo build --release -p pepd -p pep-testbed && BASE_PEPD=/path/to/base/pepd \
#     ./scripts/bench-gigabit.sh nodelay|veth
# Environment: RUNS (3), OUT (target/bench/gigabit-LINK.jsonl); BASE_PEPD: the base commit's
# pepd (rows skipped without it). Prints a table: mean ± sd (min–max) per row.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-testbed.sh
link=${1:?usage: bench-gigabit.sh nodelay|veth}
bin="${CARGO_TARGET_DIR:-target}/release"
TB="$bin/pep-testbed"
NEW="$bin/pepd"
BASE=${BASE_PEPD:-}
RUNS=${RUNS:-3}
out=${OUT:-target/bench/gigabit-$link.jsonl}
mkdir -p "$(dirname "$out")"
: > "$out"

# row LABEL PEPD ARGS...: one run of `pep-testbed run`, tagged.
row() {
  local label=$1 pepd=$2
  shift 2
  if [[ $pepd == - ]]; then return; fi
  local common=(--profile nasa --delay-ms 0 --workload download --bytes 1000000000
                --traffic-seed "$run" --max-seconds 300 --json)
  local line
  line=$(PEPD_BIN=$pepd "$TB" run "${common[@]}" "$@")
  echo "{\"label\":\"$label\",\"run\":$run,\"load\":\"$(cut -d' ' -f1 /proc/loadavg)\",\"result\":$line}" >> "$out"
}
r2=(--pepd-toml '[link] tx_rate = "2Gbit"' --pepd-toml '[link] rx_rate = "2Gbit"')
r4=(--pepd-toml '[link] tx_rate = "4Gbit"' --pepd-toml '[link] rx_rate = "4Gbit"')
r6=(--pepd-toml '[link] tx_rate = "6Gbit"' --pepd-toml '[link] rx_rate = "6Gbit"')
base=${BASE:--}
for run in $(seq 1 "$RUNS"); do
  case $link in
    nodelay)
      emu=(--rate-bps 10e9 --mode pepd)
      # The base's best rate (the gigabit work's starting figure: 1.34 Gb/s at 2 Gbit).
      row base-2G-offload "$base" "${emu[@]}" "${r2[@]}"
      row base-2G-per-packet "$base" "${emu[@]}" "${r2[@]}" --per-packet-emulation
      row new-adaptive-6G-offload "$NEW" "${emu[@]}" "${r6[@]}"
      row new-adaptive-6G-per-packet "$NEW" "${emu[@]}" "${r6[@]}" --per-packet-emulation
      row new-rate-4G-offload "$NEW" "${emu[@]}" "${r4[@]}" --pepd-toml '[transport] cc = "rate"'
      ;;
    veth)
      v=(--link veth --rate-bps)
      row plain-cubic "$NEW" "${v[@]}" 1e9 --mode plain-cubic
      row split-tcp "$NEW" "${v[@]}" 1e9 --mode split-tcp
      row base-none-1G "$base" "${v[@]}" 1e9 --mode pepd --pepd-security none
      row base-noise-1G "$base" "${v[@]}" 1e9 --mode pepd --pepd-security noise
      row new-none-6G-adaptive "$NEW" "${v[@]}" 6e9 --mode pepd --pepd-security none
      row new-noise-6G-adaptive "$NEW" "${v[@]}" 6e9 --mode pepd --pepd-security noise
      row new-none-4G-rate "$NEW" "${v[@]}" 4e9 --mode pepd --pepd-security none \
        --pepd-toml '[transport] cc = "rate"'
      row new-noise-4G-rate "$NEW" "${v[@]}" 4e9 --mode pepd --pepd-security noise \
        --pepd-toml '[transport] cc = "rate"'
      ;;
    *) echo "unknown link $link" >&2; exit 2 ;;
  esac
done
python3 - "$out" <<'PY'
import collections, json, statistics as st, sys
rows = collections.defaultdict(list)
for l in open(sys.argv[1]):
    d = json.loads(l)
    rows[d["label"]].append(d)
def stat(v, p=3):
    if not v:
        return "–"
    sd = st.stdev(v) if len(v) > 1 else 0.0
    return f"{st.mean(v):.{p}f} ± {sd:.{p}f} ({min(v):.{p}f}–{max(v):.{p}f})"
print("| row | goodput Gb/s | gateways' CPU-s per GB | machine's busy CPU-s per GB | "
      "emulator CPU share | intact | load |")
print("|---|---|---|---|---|---|---|")
for label, ds in rows.items():
    rs = [d["result"] for d in ds]
    cpu = [r["gateway_cpu"]["cpu_s_per_gb"] for r in rs if r.get("gateway_cpu")]
    machine = [r["gateway_cpu"]["machine"]["busy_s_per_gb"] for r in rs
               if (r.get("gateway_cpu") or {}).get("machine")]
    emu = [r["emulator"]["cpu_share"] for r in rs if r.get("emulator")]
    print(f"| {label} | {stat([r['goodput_bps'] / 1e9 for r in rs])} | {stat(cpu, 2)} | "
          f"{stat(machine, 2)} | {stat(emu, 2)} | {all(r['intact'] for r in rs)} | "
          f"{','.join(d['load'] for d in ds)} |")
if "split-tcp" in rows:
    split = [d["result"] for d in rows["split-tcp"]]
    sg = st.mean(r["goodput_bps"] for r in split)
    sc = st.mean(r["gateway_cpu"]["cpu_s_per_gb"] for r in split)
    for label, ds in rows.items():
        if "-none-" not in label:
            continue
        rs = [d["result"] for d in ds]
        g = st.mean(r["goodput_bps"] for r in rs) / sg
        c = st.mean(r["gateway_cpu"]["cpu_s_per_gb"] for r in rs)
        enc = rows.get(label.replace("-none-", "-noise-"))
        e = (st.mean(d["result"]["gateway_cpu"]["cpu_s_per_gb"] for d in enc) / c) if enc else float("nan")
        print(f"{label}: goodput {g:.3f} x split-tcp, CPU per GB {c / sc:.2f} x split-tcp, "
              f"encrypted {e:.3f} x unencrypted")
PY
