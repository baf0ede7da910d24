# Sourced by scripts/test-all.sh after the workspace tests.  Each lane either runs or calls
# `skip "why"`.  Variables available: have_miri (1 when cargo +nightly miri works).

# (lanes are added here by the rooms that need them: loom, miri, the Xen lab)
:
