//! Toolstack side of a vrdma device: attach and detach exactly as libxl does for a PV device
//! (docs/split-driver.md, "Device nodes"): both directories in one transaction (EAGAIN
//! retried), each owned by its side and readable by the other, quotas in the backend's
//! directory where the guest cannot change them.
//!
//! Used by `vrdmactl`, the end-to-end tests and the daemon tests. [`attach_device`] and
//! [`detach_device`] are the bare steps; [`attach`] and [`detach`] are what `vrdmactl` does
//! around them (domain check, libxl's own record under `/libxl`, waiting for the backend,
//! cleaning up empty parents). [`inspect`] reads devices, channels and counters back.

pub mod inspect;

use std::time::{Duration, Instant};

use shared_ring::abi::xenstore::DeviceKey;
use xenstore_proto::client::{Error as XsError, NodeOps, XenbusStore, XenbusStoreExt};
use xenstore_proto::wire::{Perm, PermKind, Perms};

use crate::resources::{Quotas, Resource};
use crate::xenbus::{device_backend_path, device_frontend_path, DeviceId, XenbusState};

/// What went wrong attaching or detaching.
#[derive(Debug, thiserror::Error)]
pub enum ToolstackError {
    #[error("a vrdma device is already attached at {0}")]
    AlreadyAttached(String),
    #[error("no vrdma device at {0}")]
    NotAttached(String),
    #[error("domain {0} does not exist (no /local/domain/{0})")]
    UnknownDomain(u32),
    #[error("domain {0} cannot be its own vrdma backend")]
    SelfBackend(u32),
    #[error(
        "no backend answered at {path} within {timeout:?} (state is still {state}): is \
         vrdma-backend running in domain {backend_domid}?"
    )]
    NoBackend {
        path: String,
        state: String,
        backend_domid: u32,
        timeout: Duration,
    },
    #[error("the backend refused {path}: state {state}{}", error_suffix(.error))]
    BackendRefused {
        path: String,
        state: String,
        error: Option<String>,
    },
    #[error(
        "the backend did not close {path} within {timeout:?} (state is {state}); the nodes are \
         left in place: retry, or detach with --force to remove them anyway"
    )]
    CloseTimeout {
        path: String,
        state: String,
        timeout: Duration,
    },
    #[error(transparent)]
    XenStore(#[from] XsError),
}

fn error_suffix(error: &Option<String>) -> String {
    match error {
        Some(e) => format!(" ({e})"),
        None => String::new(),
    }
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
    let quota_nodes = quotas.to_nodes();
    let attached = store.transaction(|t| {
        if t.exists(&format!("{b}/state"))? || t.exists(&format!("{f}/state"))? {
            return Ok(false);
        }
        write_device_nodes(t, &paths, frontend_domid, backend_domid, &quota_nodes)?;
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

/// libxl__device_generic_add's writes: each directory made and given its permissions first
/// (owner with no access for others, the other end may read), so the keys written below
/// inherit them; `frontend`/`backend` links, ids, `online = 1`, `state = 1`, and the quotas in
/// the backend directory.
fn write_device_nodes(
    t: &dyn NodeOps,
    paths: &DevicePaths,
    frontend_domid: u32,
    backend_domid: u32,
    quota_nodes: &[(&str, String)],
) -> xenstore_proto::client::Result<()> {
    let (b, f) = (&paths.backend, &paths.frontend);
    let state = XenbusState::Initialising.value();
    t.mkdir(f)?;
    t.set_perms(f, &frontend_perms(frontend_domid, backend_domid))?;
    write_all(
        t,
        f,
        &[
            (DeviceKey::Backend.as_str(), b.as_str()),
            (DeviceKey::BackendId.as_str(), &backend_domid.to_string()),
            (DeviceKey::State.as_str(), &state),
        ],
    )?;
    t.mkdir(b)?;
    t.set_perms(b, &backend_perms(frontend_domid, backend_domid))?;
    write_all(
        t,
        b,
        &[
            (DeviceKey::Frontend.as_str(), f.as_str()),
            (DeviceKey::FrontendId.as_str(), &frontend_domid.to_string()),
            (DeviceKey::Online.as_str(), "1"),
            (DeviceKey::State.as_str(), &state),
        ],
    )?;
    for (k, v) in quota_nodes {
        t.write(&format!("{b}/{k}"), v.as_bytes())?;
    }
    Ok(())
}

/// The backend directory's permissions: owned by the backend domain, readable by the guest.
pub fn backend_perms(frontend_domid: u32, backend_domid: u32) -> Perms {
    Perms(vec![
        Perm::new(PermKind::None, backend_domid),
        Perm::new(PermKind::Read, frontend_domid),
    ])
}

/// The frontend directory's permissions: owned by the guest, readable by the backend domain.
pub fn frontend_perms(frontend_domid: u32, backend_domid: u32) -> Perms {
    Perms(vec![
        Perm::new(PermKind::None, frontend_domid),
        Perm::new(PermKind::Read, backend_domid),
    ])
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

/// How long libxl waits for a backend's InitWait after adding a device
/// (`LIBXL_INIT_TIMEOUT`), and for its Closed when removing one (`LIBXL_DESTROY_TIMEOUT`).
pub const LIBXL_TIMEOUT: Duration = Duration::from_secs(10);

/// libxl's own record of a device (dom0 only): `/libxl/<D>/device/vrdma/<devid>` with
/// `frontend` and `backend`, written in the same transaction as the device (libxl 4.17).
pub fn libxl_record_path(frontend_domid: u32, devid: u32) -> String {
    format!("/libxl/{frontend_domid}/device/vrdma/{devid}")
}

/// What `vrdmactl attach` asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AttachRequest {
    pub frontend_domid: u32,
    pub backend_domid: u32,
    pub devid: u32,
    /// Quotas written into the backend node; the others take the daemon's configured
    /// defaults (`[quotas]` of its config file).
    pub quotas: Vec<(Resource, u32)>,
}

/// Attaches a device as `xl` would: checks the guest domain exists and has no such device,
/// then writes both device directories and libxl's record in one transaction (EAGAIN
/// retried). Does not wait: see [`wait_backend_ready`].
pub fn attach(store: &dyn XenbusStore, req: &AttachRequest) -> Result<DevicePaths, ToolstackError> {
    let (fdom, bdom, devid) = (req.frontend_domid, req.backend_domid, req.devid);
    if fdom == bdom {
        return Err(ToolstackError::SelfBackend(fdom));
    }
    let paths = device_paths(fdom, bdom, devid);
    let record = libxl_record_path(fdom, devid);
    let quota_nodes: Vec<(&str, String)> = req
        .quotas
        .iter()
        .map(|(r, v)| (r.quota_key(), v.to_string()))
        .collect();
    enum Outcome {
        Attached,
        NoDomain,
        Already,
    }
    let outcome = store.transaction(|t| {
        if !t.exists(&format!("/local/domain/{fdom}"))? {
            return Ok(Outcome::NoDomain);
        }
        if t.exists(&paths.backend)? || t.exists(&paths.frontend)? {
            return Ok(Outcome::Already);
        }
        write_device_nodes(t, &paths, fdom, bdom, &quota_nodes)?;
        write_all(
            t,
            &record,
            &[
                ("frontend", paths.frontend.as_str()),
                ("backend", paths.backend.as_str()),
            ],
        )?;
        Ok(Outcome::Attached)
    })?;
    match outcome {
        Outcome::Attached => {
            tracing::info!(
                "vrdma device {devid} of domain {fdom} attached to backend domain {bdom}"
            );
            Ok(paths)
        }
        Outcome::NoDomain => Err(ToolstackError::UnknownDomain(fdom)),
        Outcome::Already => Err(ToolstackError::AlreadyAttached(paths.backend)),
    }
}

/// Waits, as libxl does after adding a device, until the backend answers InitWait (or has
/// gone further: Initialised, Connected). A backend that closes the device instead is
/// [`ToolstackError::BackendRefused`] (with its `error` node); no answer in `timeout` is
/// [`ToolstackError::NoBackend`].
pub fn wait_backend_ready(
    store: &dyn XenbusStore,
    paths: &DevicePaths,
    backend_domid: u32,
    timeout: Duration,
) -> Result<XenbusState, ToolstackError> {
    let state_path = format!("{}/state", paths.backend);
    let mut watch = store.watch(&state_path)?;
    let deadline = Instant::now() + timeout;
    loop {
        let raw = store.read_opt(&state_path)?;
        let state = raw.as_deref().and_then(XenbusState::parse);
        match state {
            None if raw.is_none() => {
                return Err(ToolstackError::NotAttached(paths.backend.clone()));
            }
            Some(
                s @ (XenbusState::InitWait | XenbusState::Initialised | XenbusState::Connected),
            ) => {
                return Ok(s);
            }
            Some(s @ (XenbusState::Closing | XenbusState::Closed)) => {
                let error = store
                    .read_opt(&format!("{}/error", paths.backend))?
                    .map(|v| String::from_utf8_lossy(&v).into_owned());
                return Err(ToolstackError::BackendRefused {
                    path: paths.backend.clone(),
                    state: s.to_string(),
                    error,
                });
            }
            _ => {}
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ToolstackError::NoBackend {
                path: paths.backend.clone(),
                state: describe_state(raw.as_deref()),
                backend_domid,
                timeout,
            });
        }
        watch.next_event(Some(left))?;
    }
}

fn describe_state(raw: Option<&[u8]>) -> String {
    match raw {
        None => "missing".into(),
        Some(v) => match XenbusState::parse(v) {
            Some(s) => s.to_string(),
            None => format!("{:?}", String::from_utf8_lossy(v)),
        },
    }
}

/// What a [`detach`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DetachOutcome {
    pub paths: DevicePaths,
    /// The backend answered Closed (or had removed its node) in time; false only with `force`.
    pub closed: bool,
}

/// Detaches a device with libxl's etiquette (libxl__initiate_device_remove): unless the
/// backend is already Closed, `online = 0` and `state = 5` in one transaction; wait up to
/// `timeout` for Closed; then remove the frontend and backend directories, libxl's record and
/// the per-domain parents left empty (libxl__xs_path_cleanup). If the backend does not close
/// in time the nodes stay ([`ToolstackError::CloseTimeout`]) unless `force`. Works for a
/// domain that is already gone (its frontend directory went with it).
pub fn detach(
    store: &dyn XenbusStore,
    frontend_domid: u32,
    backend_domid: u32,
    devid: u32,
    timeout: Duration,
    force: bool,
) -> Result<DetachOutcome, ToolstackError> {
    let paths = device_paths(frontend_domid, backend_domid, devid);
    let record = libxl_record_path(frontend_domid, devid);
    let b = &paths.backend;
    let found = store.transaction(|t| {
        let state = t.read_opt(&format!("{b}/state"))?;
        if state.is_none() {
            // Half-made or half-removed: nothing to ask the backend, just clean up.
            return Ok(t.exists(b)? || t.exists(&paths.frontend)? || t.exists(&record)?);
        }
        if state.as_deref().and_then(XenbusState::parse) != Some(XenbusState::Closed) {
            t.write(&format!("{b}/online"), b"0")?;
            t.write(
                &format!("{b}/state"),
                XenbusState::Closing.value().as_bytes(),
            )?;
        }
        Ok(true)
    })?;
    if !found {
        if !store.exists(&format!("/local/domain/{frontend_domid}"))? {
            return Err(ToolstackError::UnknownDomain(frontend_domid));
        }
        return Err(ToolstackError::NotAttached(paths.backend));
    }
    let closed = wait_backend_closed(store, &paths, timeout)?;
    if !closed {
        let state = describe_state(store.read_opt(&format!("{b}/state"))?.as_deref());
        if !force {
            return Err(ToolstackError::CloseTimeout {
                path: paths.backend,
                state,
                timeout,
            });
        }
        tracing::warn!(
            "the backend did not close {b} within {timeout:?} (state {state}); removing it anyway (--force)"
        );
    }
    remove_device_nodes(store, &paths, frontend_domid, backend_domid, devid)?;
    tracing::info!("vrdma device {devid} of domain {frontend_domid} detached");
    Ok(DetachOutcome { paths, closed })
}

/// Removes both device directories and libxl's record in one transaction, with the
/// per-domain parents they leave empty (`backend/vrdma/<D>`, the guest's `device/vrdma`,
/// `/libxl/<D>/device/vrdma` and up to `/libxl/<D>`).
pub fn remove_device_nodes(
    store: &dyn XenbusStore,
    paths: &DevicePaths,
    frontend_domid: u32,
    backend_domid: u32,
    devid: u32,
) -> Result<(), ToolstackError> {
    let record = libxl_record_path(frontend_domid, devid);
    let parents = [
        format!("/local/domain/{backend_domid}/backend/vrdma/{frontend_domid}"),
        format!("/local/domain/{frontend_domid}/device/vrdma"),
        format!("/libxl/{frontend_domid}/device/vrdma"),
        format!("/libxl/{frontend_domid}/device"),
        format!("/libxl/{frontend_domid}"),
    ];
    store.transaction(|t| {
        for p in [&paths.frontend, &paths.backend, &record] {
            rm_if_present(t, p)?;
        }
        for p in &parents {
            match t.directory(p) {
                Ok(children) if children.is_empty() => rm_if_present(t, p)?,
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    })?;
    Ok(())
}

fn rm_if_present(t: &dyn NodeOps, path: &str) -> xenstore_proto::client::Result<()> {
    match t.rm(path) {
        Err(e) if e.is_not_found() => Ok(()),
        other => other,
    }
}
