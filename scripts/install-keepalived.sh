#!/usr/bin/env bash
# Installs keepalived (Debian package) for the failover testbed and tests, without letting
# the package start it: the testbed runs keepalived only inside the namespaces it builds,
# never in the host's. A policy-rc.d that refuses every start (exit 101) is put in place
# for the install when the host has none, and removed afterwards.
set -euo pipefail
command -v keepalived >/dev/null 2>&1 && exit 0
if [ "$(id -u)" != 0 ]; then
    echo "keepalived is missing: run $0 as root" >&2
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
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends keepalived
# A unit enabled by the package would start keepalived in the host's namespace at boot.
if command -v systemctl >/dev/null 2>&1; then
    systemctl disable keepalived.service >/dev/null 2>&1 || true
fi
