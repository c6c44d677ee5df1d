#!/usr/bin/env bash
# Installs what every netns testbed run needs (Debian packages), where it is missing: ip to
# build the namespaces, nft for the interception rules, sysctl for each namespace's settings,
# setpriv for the tools run as another user, ping for the tests' reachability checks. The
# tests, the demo and each benchmark on the testbed call it first.
set -euo pipefail
need=()
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v nft >/dev/null 2>&1 || need+=(nftables)
command -v sysctl >/dev/null 2>&1 || need+=(procps)
command -v setpriv >/dev/null 2>&1 || need+=(util-linux)
command -v ping >/dev/null 2>&1 || need+=(iputils-ping)
((${#need[@]})) || exit 0
exec "$(dirname "$0")/install-quietly.sh" "${need[@]}"
