#!/usr/bin/env bash
# Installs FRR (Debian package) for the announcement tests and the N+1 testbed, without
# letting the package start it (scripts/install-quietly.sh): zebra and bgpd run only inside
# the namespaces a test builds, never in the host's (the package's unit would start zebra,
# staticd and watchfrr there at boot).
set -euo pipefail
command -v vtysh >/dev/null 2>&1 && [ -x /usr/lib/frr/zebra ] && exit 0
exec "$(dirname "$0")/install-quietly.sh" --disable frr.service frr
