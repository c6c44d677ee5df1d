#!/usr/bin/env bash
# The project's demo (README.md "Set up on a fresh machine"): plain TCP against pepd on an
# emulated GEO satellite link, side by side. Installs what the testbed needs on a fresh
# Debian machine, builds pepd and pep-testbed, then runs `pep-testbed demo` (root: it
# builds network namespaces). Arguments go to the demo, e.g. `--repeat 3`, `--quick`,
# `--out DIR`.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
    echo "the demo builds network namespaces: run it as root" >&2
    exit 1
fi
./scripts/install-testbed.sh

cargo build --release -p pepd -p pep-testbed
bin="${CARGO_TARGET_DIR:-target}/release"
# pep-testbed finds pepd beside itself; PEPD_BIN (if set) still wins.
exec "$bin/pep-testbed" demo "$@"
