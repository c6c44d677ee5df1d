#!/usr/bin/env bash
# The seeds' benchmark set through pepd on the emulated links, one JSON line per run plus a
# PASS/FAIL verdict against the acceptance bounds. Needs root (namespaces). Usage:
#   cargo build --release -p pepd -p pep-testbed && ./scripts/bench-pepd.sh
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-testbed.sh
bin="${CARGO_TARGET_DIR:-target}/release"
TB="$bin/pep-testbed"
export PEPD_BIN=${PEPD_BIN:-$bin/pepd}
fails=0
verdict() { # name ok detail
  if [ "$2" = 1 ]; then echo -e "PASS\t$1\t$3"; else echo -e "FAIL\t$1\t$3"; fails=$((fails+1)); fi
}
field() { python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print(eval(sys.argv[1]))" "$1"; }

for ber in 0 1e-8 1e-7 1e-6 1e-5; do
  cmd="$TB run --profile lawson --mode pepd --ber $ber --workload download --bytes 5000000 --max-seconds 120 --json"
  out=$($cmd | tail -1)
  eff=$(echo "$out" | field "round(d['efficiency'],3)")
  ok=$(echo "$out" | field "int(d['intact'] and d['efficiency']>=0.90)")
  verdict "lawson ber=$ber efficiency>=0.90" "$ok" "eff=$eff goodput=$(echo "$out" | field "round(d['goodput_bps']/1e6,3)")Mb/s  $cmd"
done
for ber in 0 1e-7 1e-5; do
  cmd="$TB run --profile nasa --mode pepd --ber $ber --workload download --bytes 100000000 --max-seconds 120 --json"
  out=$($cmd | tail -1)
  # T_min: one round trip to ask plus the bytes at the reference goodput.
  r=$(echo "$out" | field "round(d['completion_s']/(0.5+d['bytes']*8/d['ref_bps']),3)")
  ok=$(echo "$out" | field "int(d['intact'] and d['completion_s']/(0.5+d['bytes']*8/d['ref_bps'])<=1.2)")
  verdict "nasa ber=$ber completion<=1.2*T_min" "$ok" "ratio=$r completion=$(echo "$out" | field "round(d['completion_s'],2)")s  $cmd"
done
cmd="$TB run --profile geo --mode pepd --workload rr --request-bytes 100 --response-bytes 100000 --repeat 10 --json"
out=$($cmd | tail -1)
bound=$(python3 -c "print(1.15*(0.6+100000*8/20e6))")
mean=$(echo "$out" | field "round(sum(d['latencies_s'])/len(d['latencies_s']),3)")
ok=$(echo "$out" | field "int(d['intact'] and sum(d['latencies_s'])/len(d['latencies_s'])<=$bound)")
verdict "geo rr 100KB mean latency<=1.15*(RTT+size/rate)=$(printf %.3f "$bound")s" "$ok" "mean=${mean}s  $cmd"
cmd="$TB run --profile adalr --mode pepd --workload page --json"
out=$($cmd | tail -1)
c=$(echo "$out" | field "round(d['completion_s'],3)")
ok=$(echo "$out" | field "int(d['intact'] and d['completion_s']<=2.4)")
verdict "adalr page<=2.4s" "$ok" "completion=${c}s  $cmd"
echo "failed: $fails"
