//! The XenStore client (in progress).
