//! Memory shared between vrdma frontend and backend: the Xen `io/ring.h` ABI and the vrdma layouts.
