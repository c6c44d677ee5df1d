#!/usr/bin/env bash
# Installs keepalived (Debian package) for the failover testbed and tests, without letting
# the package start it (scripts/install-quietly.sh): the testbed runs keepalived only inside
# the namespaces it builds, never in the host's.
set -euo pipefail
command -v keepalived >/dev/null 2>&1 && exit 0
exec "$(dirname "$0")/install-quietly.sh" --disable keepalived.service keepalived
