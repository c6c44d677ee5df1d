#!/usr/bin/env bash
# Checks the systemd units in deploy/: `systemd-analyze verify` on both (pepd.service
# also with the drop-in deploy/pepd-announce.conf), and the
# sandboxing score of pepd.service from `systemd-analyze security --offline=true`.
# Prints the exposure score (0 = locked down, 10 = exposed) and fails above MAX_EXPOSURE
# (default 3.0; docs/OPERATIONS.md records the current score).
#
# The units name /usr/bin/pepd and /usr/libexec/pepd/pepd-apply-rules; verify needs
# the programs to exist, so it runs on copies pointing at a built binary (PEPD, default
# $CARGO_TARGET_DIR/release/pepd, built if missing) and at the script in deploy/.
# Installs systemd with apt-get on a Debian machine without it (root only).
set -euo pipefail
cd "$(dirname "$0")/.."

max_exposure=${MAX_EXPOSURE:-3.0}

if ! command -v systemd-analyze >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd
    else
        echo "systemd-analyze missing: install systemd" >&2
        exit 1
    fi
fi

target=${CARGO_TARGET_DIR:-target}
pepd=${PEPD:-$target/release/pepd}
if [ ! -x "$pepd" ]; then
    cargo build --release -p pepd
fi
pepd=$(realpath "$pepd")
apply=$(realpath deploy/pepd-apply-rules)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for unit in pepd.service pepd-rules.service; do
    sed -e "s|/usr/bin/pepd|$pepd|g" \
        -e "s|/usr/libexec/pepd/pepd-apply-rules|$apply|g" \
        "deploy/$unit" >"$work/$unit"
done

# Runs COMMAND... (a systemd-analyze verify): it prints problems and exits non-zero on
# errors; warnings alone are shown too, so any output is treated as a failure.
quiet_or_fail() {
    local out
    out=$("$@" 2>&1) || {
        echo "$out" >&2
        exit 1
    }
    if [ -n "$out" ]; then
        echo "$out" >&2
        exit 1
    fi
    echo "ok"
}

echo "== systemd-analyze verify"
quiet_or_fail systemd-analyze verify --man=no "$work/pepd.service" "$work/pepd-rules.service"

echo "== systemd-analyze verify pepd.service with deploy/pepd-announce.conf"
mkdir "$work/pepd.service.d"
sed -e "s|/usr/bin/pepd|$pepd|g" deploy/pepd-announce.conf >"$work/pepd.service.d/announce.conf"
quiet_or_fail env SYSTEMD_UNIT_PATH="$work:" systemd-analyze verify --man=no "$work/pepd.service"

echo "== systemd-analyze security --offline=true deploy/pepd.service"
security=$(systemd-analyze security --offline=true --no-pager "$work/pepd.service" 2>&1)
echo "$security" | grep -v '^✓' || true
score=$(echo "$security" | sed -n 's/.*Overall exposure level for .*: \([0-9.]*\).*/\1/p')
if [ -z "$score" ]; then
    echo "no exposure score in the output above" >&2
    exit 1
fi
echo "exposure score: $score (limit $max_exposure)"
awk -v s="$score" -v m="$max_exposure" 'BEGIN { exit !(s <= m) }' || {
    echo "pepd.service is more exposed than $max_exposure" >&2
    exit 1
}
