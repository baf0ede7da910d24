//! Grants, event channels and XenStore transport, on real Xen and on the simulated Xen host.
