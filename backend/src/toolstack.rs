//! Toolstack side of a vrdma device: attach and detach exactly as libxl does for a PV device
//! (docs/split-driver.md, "Device nodes"): both directories in one transaction (EAGAIN
//! retried), each owned by its side and readable by the other, quotas in the backend's
//! directory where the guest cannot change them.
//!
//! Used by `vrdmactl`, the end-to-end tests and the daemon tests.

use std::time::{Duration, Instant};

use xenstore_proto::client::{Error as XsError, NodeOps, XenbusStore, XenbusStoreExt};
use xenstore_proto::wire::{Perm, PermKind, Perms};

use crate::resources::Quotas;
use crate::xenbus::{device_backend_path, device_frontend_path, DeviceId, XenbusState};

/// What went wrong attaching or detaching.
#[derive(Debug, thiserror::Error)]
pub enum ToolstackError {
    #[error("a vrdma device is already attached at {0}")]
    AlreadyAttached(String),
    #[error("no vrdma device at {0}")]
    NotAttached(String),
    #[error(transparent)]
    XenStore(#[from] XsError),
}

/// Where a device's nodes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevicePaths {
    pub backend: String,
    pub frontend: String,
}

/// The paths of device `devid` of domain `frontend_domid` served by `backend_domid`.
pub fn device_paths(frontend_domid: u32, backend_domid: u32, devid: u32) -> DevicePaths {
    let id = DeviceId {
        domid: frontend_domid,
        devid,
    };
    DevicePaths {
        backend: device_backend_path(backend_domid, id),
        frontend: device_frontend_path(id),
    }
}

/// Attaches a vrdma device: writes both device directories in one transaction (retried on
/// EAGAIN) with libxl's permissions and the quotas. The backend answers InitWait.
pub fn attach_device(
    store: &dyn XenbusStore,
    frontend_domid: u32,
    backend_domid: u32,
    devid: u32,
    quotas: &Quotas,
) -> Result<DevicePaths, ToolstackError> {
    let paths = device_paths(frontend_domid, backend_domid, devid);
    let (b, f) = (&paths.backend, &paths.frontend);
    let backend_perms = Perms(vec![
        Perm::new(PermKind::None, backend_domid),
        Perm::new(PermKind::Read, frontend_domid),
    ]);
    let frontend_perms = Perms(vec![
        Perm::new(PermKind::None, frontend_domid),
        Perm::new(PermKind::Read, backend_domid),
    ]);
    let quota_nodes = quotas.to_nodes();
    let attached = store.transaction(|t| {
        if t.exists(&format!("{b}/state"))? || t.exists(&format!("{f}/state"))? {
            return Ok(false);
        }
        // Directories first, with their permissions, so the nodes below inherit them.
        t.mkdir(b)?;
        t.set_perms(b, &backend_perms)?;
        t.mkdir(f)?;
        t.set_perms(f, &frontend_perms)?;
        let state = XenbusState::Initialising.value();
        write_all(
            t,
            b,
            &[
                ("frontend", f.as_str()),
                ("frontend-id", &frontend_domid.to_string()),
                ("online", "1"),
                ("state", &state),
            ],
        )?;
        for (k, v) in &quota_nodes {
            t.write(&format!("{b}/{k}"), v.as_bytes())?;
        }
        write_all(
            t,
            f,
            &[
                ("backend", b.as_str()),
                ("backend-id", &backend_domid.to_string()),
                ("state", &state),
            ],
        )?;
        Ok(true)
    })?;
    if !attached {
        return Err(ToolstackError::AlreadyAttached(paths.backend));
    }
    tracing::info!(
        "vrdma device {devid} of domain {frontend_domid} attached to backend domain {backend_domid}"
    );
    Ok(paths)
}

fn write_all(
    t: &dyn NodeOps,
    base: &str,
    nodes: &[(&str, &str)],
) -> xenstore_proto::client::Result<()> {
    for (k, v) in nodes {
        t.write(&format!("{base}/{k}"), v.as_bytes())?;
    }
    Ok(())
}

/// First half of a detach: `online = 0`, `state = 5` in the backend directory.
pub fn begin_detach(
    store: &dyn XenbusStore,
    frontend_domid: u32,
    backend_domid: u32,
    devid: u32,
) -> Result<DevicePaths, ToolstackError> {
    let paths = device_paths(frontend_domid, backend_domid, devid);
    let b = &paths.backend;
    let found = store.transaction(|t| {
        if !t.exists(&format!("{b}/state"))? {
            return Ok(false);
        }
        t.write(&format!("{b}/online"), b"0")?;
        t.write(
            &format!("{b}/state"),
            XenbusState::Closing.value().as_bytes(),
        )?;
        Ok(true)
    })?;
    if !found {
        return Err(ToolstackError::NotAttached(paths.backend));
    }
    Ok(paths)
}

/// Second half of a detach: removes both directories in one transaction.
pub fn finish_detach(store: &dyn XenbusStore, paths: &DevicePaths) -> Result<(), ToolstackError> {
    store.transaction(|t| {
        for p in [&paths.backend, &paths.frontend] {
            match t.rm(p) {
                Err(e) if e.is_not_found() => {}
                other => other?,
            }
        }
        Ok(())
    })?;
    Ok(())
}

/// Waits until the backend's device `state` is Closed (or the node is gone); false on timeout.
pub fn wait_backend_closed(
    store: &dyn XenbusStore,
    paths: &DevicePaths,
    timeout: Duration,
) -> Result<bool, ToolstackError> {
    let state_path = format!("{}/state", paths.backend);
    let mut watch = store.watch(&state_path)?;
    let deadline = Instant::now() + timeout;
    loop {
        match store.read_opt(&state_path)? {
            None => return Ok(true),
            Some(v) if XenbusState::parse(&v) == Some(XenbusState::Closed) => return Ok(true),
            Some(_) => {}
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        watch.next_event(Some(left))?;
    }
}

/// Detaches a device as libxl does: asks the backend to close (online 0, state 5), waits up
/// to `timeout` for its Closed, then removes both directories either way. Returns whether the
/// backend answered in time.
pub fn detach_device(
    store: &dyn XenbusStore,
    frontend_domid: u32,
    backend_domid: u32,
    devid: u32,
    timeout: Duration,
) -> Result<bool, ToolstackError> {
    let paths = begin_detach(store, frontend_domid, backend_domid, devid)?;
    let closed = wait_backend_closed(store, &paths, timeout)?;
    if !closed {
        tracing::warn!(
            "backend did not close vrdma device {devid} of domain {frontend_domid} within {timeout:?}; removing it anyway"
        );
    }
    finish_detach(store, &paths)?;
    Ok(closed)
}
