#!/usr/bin/env bash
# Installs the browser workload's real clients and server (Debian packages) for the testbed's
# `browser` benchmark: caddy (serves HTTP/1.1, HTTP/2 and HTTP/3), headless chromium, and
# certutil (libnss3-tools) to trust the benchmark's own certificate authority in a browser
# profile. The packages must not start anything: the testbed runs caddy only inside the
# namespaces it builds, never in the host's. A policy-rc.d that refuses every start (exit 101)
# is put in place for the install when the host has none, and removed afterwards.
set -euo pipefail
have_all() {
    command -v caddy >/dev/null 2>&1 &&
        command -v chromium >/dev/null 2>&1 &&
        command -v certutil >/dev/null 2>&1 &&
        command -v openssl >/dev/null 2>&1
}
have_all && exit 0
if [ "$(id -u)" != 0 ]; then
    echo "caddy, chromium, certutil or openssl is missing: run $0 as root" >&2
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
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    caddy chromium libnss3-tools openssl
# The package enables a unit that would serve on the host's port 80 at boot.
if command -v systemctl >/dev/null 2>&1; then
    systemctl disable --now caddy.service >/dev/null 2>&1 || true
fi
