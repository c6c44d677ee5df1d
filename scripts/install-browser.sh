#!/usr/bin/env bash
# Installs the browser workload's real clients and server (Debian packages) for the testbed's
# `browser` benchmark: caddy (serves HTTP/1.1, HTTP/2 and HTTP/3), headless chromium, and
# certutil (libnss3-tools) to trust the benchmark's own certificate authority in a browser
# profile; none of them started (scripts/install-quietly.sh): the testbed runs caddy only
# inside the namespaces it builds, and the package's unit would serve the host's port 80.
set -euo pipefail
command -v caddy >/dev/null 2>&1 &&
    command -v chromium >/dev/null 2>&1 &&
    command -v certutil >/dev/null 2>&1 &&
    command -v openssl >/dev/null 2>&1 &&
    exit 0
exec "$(dirname "$0")/install-quietly.sh" --disable caddy.service \
    caddy chromium libnss3-tools openssl
