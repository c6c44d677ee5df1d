#!/usr/bin/env bash
# The project's test command (README.md "Run the tests"). Installs what the tests need on a
# fresh Debian machine, then runs formatting, lints and the whole test suite. Network tests
# build their own namespaces and need root (without it they skip, unless PEPD_REQUIRE_ROOT_TESTS
# is set).
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install-testbed.sh

# keepalived for the failover tests, FRR for the check of its example (installed so that
# neither ever starts outside the namespaces of those tests).
if [ "$(id -u)" = 0 ]; then
    ./scripts/install-keepalived.sh
    ./scripts/install-frr.sh
fi

# Unused dependencies (reads the sources, well under a second; also covers fuzz/).
command -v cargo-machete >/dev/null 2>&1 || cargo install --locked cargo-machete

cargo fmt --all -- --check
cargo machete
cargo clippy --workspace --all-targets --release -- -D warnings
cargo test --workspace --release
# The transport's performance targets, checked in the deterministic simulator (~15 s).
./scripts/sim-acceptance.sh
# The systemd units: `systemd-analyze verify` and the sandboxing score (installs systemd).
./scripts/check-unit.sh
# deploy/frr/frr.conf.example: FRR takes it and advertises pepd's table (root, namespaces).
if [ "$(id -u)" = 0 ]; then
    ./scripts/check-frr-example.sh
fi
