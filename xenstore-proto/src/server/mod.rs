//! The embedded XenStore server (in progress).
