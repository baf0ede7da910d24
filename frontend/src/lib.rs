//! The vrdma frontend library (verbs for Xen guests).
//!
//! Empty so far: the split-driver issue fills this room. Nothing here pretends to work.
