# Sourced by scripts/test-all.sh after the workspace tests.  Each lane either runs or calls
# `skip "why"`.  Variables available: have_miri (1 when cargo +nightly miri works).

# --- shared-ring: loom models of the notification hold-off, doorbell kick and CQ arming ------
# (loom_fence is the negative control: without the full fence loom must find a lost wake-up.)
say "shared-ring: loom models"
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
    cargo test -p shared-ring --release --test loom --test loom_fence

# --- shared-ring: miri over the ring, queue, CQ and hostile-peer tests ------------------------
if [ "$have_miri" = 1 ]; then
    say "shared-ring: miri (lib, hostile, props)"
    cargo +nightly miri test -p shared-ring --lib --test hostile --test props
else
    skip "shared-ring miri lane: nightly toolchain with miri is not available"
fi

# --- fuzzing: every cargo-fuzz target about a minute (scripts/fuzz.sh, docs/fuzzing.md) ------
# Guest bytes (control slots, WQEs, page directories), hostile-backend bytes (CQEs, the event
# ring, the doorbell page, control responses) and XenStore peers (codec, server).
# FUZZ_SECONDS changes the time per target.
if [ "$have_nightly" = 1 ]; then
    if ! cargo fuzz --version >/dev/null 2>&1; then
        say "installing cargo-fuzz"
        cargo install cargo-fuzz --locked
    fi
    say "fuzz targets, ${FUZZ_SECONDS:-60} s each"
    scripts/fuzz.sh "${FUZZ_SECONDS:-60}"
else
    skip "fuzz lane: the nightly toolchain (cargo-fuzz needs it) is not available"
fi
