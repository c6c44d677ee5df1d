#!/usr/bin/env bash
# Installs Debian packages without letting them start anything: the tests and benchmarks
# run their daemons only inside the namespaces they build, never in the host's. A
# policy-rc.d that refuses every start (exit 101) is put in place for the install when the
# host has none, and removed afterwards; each unit named with --disable is disabled, so
# that it does not start at boot either.
# Usage: scripts/install-quietly.sh [--disable UNIT]... PACKAGE...
set -euo pipefail
units=()
while [ "${1:-}" = --disable ]; do
    units+=("$2")
    shift 2
done
if [ "$#" = 0 ]; then
    echo "usage: $0 [--disable UNIT]... PACKAGE..." >&2
    exit 2
fi
if [ "$(id -u)" != 0 ]; then
    echo "$* missing: run $0 as root" >&2
    exit 1
fi
policy=/usr/sbin/policy-rc.d
placed=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    placed=1
fi
trap '[ "$placed" = 1 ] && rm -f "$policy"' EXIT
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
if command -v systemctl >/dev/null 2>&1; then
    for unit in "${units[@]}"; do
        systemctl disable "$unit" >/dev/null 2>&1 || true
    done
fi
