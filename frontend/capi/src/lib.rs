//! `libvrdma`: the C ABI of the vrdma frontend library (see `include/vrdma.h`).
