#!/usr/bin/env bash
# Runs every vrdma test on a fresh Debian machine: installs every Debian package the tests
# need (scripts/host-packages.txt) and checks that they cover every command the tests call,
# then fmt check, clippy -D warnings, the workspace tests, loom models, miri, the fuzz targets
# and the Xen lab.
# Anything that cannot run says so loudly and fails the run unless VRDMA_ALLOW_SKIP=1.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\n=== %s\n' "$*"; }
skipped=()
skip() {
    printf '\n!!! SKIPPED: %s\n' "$*" >&2
    skipped+=("$*")
}

# --- Debian packages the tests use -------------------------------------------------------
# Every package the tests and the Xen lab need on the host, with the commands each provides,
# is in scripts/host-packages.txt; all of them are installed here, up front (one apt-get
# update, one install), and scripts/check-host-deps.py then proves that every command the
# test scripts and tests call on the host comes from one of them.
mapfile -t host_pkgs < <(sed 's/#.*//' scripts/host-packages.txt | awk 'NF { print $1 }')
need=()
# The packages the Xen lab and Xen's own tools need must stay in that list.
lab_pkgs=(qemu-system-x86 cpio kmod xenstore-utils xen-utils-4.17 libxen-dev)
for p in "${lab_pkgs[@]}"; do
    printf '%s\n' "${host_pkgs[@]}" | grep -qx -- "$p" || { echo "scripts/host-packages.txt lacks $p" >&2; exit 1; }
done
for pkg in "${host_pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    say "installing Debian packages: ${need[*]}"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

say "host commands: every one comes from an installed package of scripts/host-packages.txt"
python3 scripts/check-host-deps.py --installed

# --- Rust components --------------------------------------------------------------------
rustup component add rustfmt clippy >/dev/null 2>&1 || true
have_nightly=0
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal >/dev/null 2>&1 || true
rustup toolchain list | grep -q '^nightly' && have_nightly=1
have_miri=0
if rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal >/dev/null 2>&1; then
    if rustup component add --toolchain nightly miri rust-src >/dev/null 2>&1; then
        have_miri=1
    fi
fi

say "cargo fmt --check"
cargo fmt --all -- --check

say "cargo clippy --all-targets -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

say "cargo test (workspace)"
cargo test --workspace

if [ -f scripts/extra-tests.sh ]; then
    # Room-specific lanes (loom models, miri, fuzzing) live beside this script.
    # shellcheck source=/dev/null
    . scripts/extra-tests.sh
fi

say "Xen lab: real Xen 4.17 + dom0 + PV domUs under QEMU (tests/xen-lab)"
if command -v qemu-system-x86_64 >/dev/null; then
    tests/xen-lab/run-all.sh
else
    skip "Xen lab: qemu-system-x86_64 is not installed and apt could not install it"
fi

if [ ${#skipped[@]} -gt 0 ]; then
    say "SKIPPED LANES (${#skipped[@]}):"
    for s in "${skipped[@]}"; do echo "  - $s"; done
    if [ "${VRDMA_ALLOW_SKIP:-0}" != "1" ]; then
        echo "failing because lanes were skipped (set VRDMA_ALLOW_SKIP=1 to accept)" >&2
        exit 1
    fi
fi
say "ALL TESTS PASSED"
