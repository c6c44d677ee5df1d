#!/usr/bin/env bash
# Installs FRR (Debian package) for the announcement tests and the N+1 testbed, without
# letting the package start it: zebra and bgpd run only inside the namespaces a test builds
# (`-N` pathspaces), never in the host's. A policy-rc.d that refuses every start (exit 101)
# is put in place for the install when the host has none, and removed afterwards.
set -euo pipefail
command -v vtysh >/dev/null 2>&1 && [ -x /usr/lib/frr/zebra ] && exit 0
if [ "$(id -u)" != 0 ]; then
    echo "frr is missing: run $0 as root" >&2
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
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends frr
# A unit enabled by the package would start zebra, staticd and watchfrr in the host's
# namespace at boot.
if command -v systemctl >/dev/null 2>&1; then
    systemctl disable frr.service >/dev/null 2>&1 || true
fi
