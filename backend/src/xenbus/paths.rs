//! XenStore paths of the vrdma device class (docs/split-driver.md) and the small read/write
//! helpers the device and channel state machines share. Depends on nothing else in `xenbus`
//! but its plain types (the import order is paths ← channel ← backend).

use shared_ring::abi::xenstore::ChannelKey;
use xenstore_proto::client::{NodeOps, Result, XenbusStore};

use super::DeviceId;
use crate::resources::{Quotas, Resource};

/// `/local/domain/<B>/backend/vrdma`: what the backend watches.
pub fn backend_root(backend_domid: u32) -> String {
    format!("/local/domain/{backend_domid}/backend/vrdma")
}

/// `/local/domain/<B>/backend/vrdma/<D>/<devid>`.
pub fn device_backend_path(backend_domid: u32, id: DeviceId) -> String {
    format!("{}/{}/{}", backend_root(backend_domid), id.domid, id.devid)
}

/// `/local/domain/<B>/vrdma-stats`: where the backend publishes counters, outside the root it
/// watches so publishing never fires the backend's own watch.
pub fn stats_root(backend_domid: u32) -> String {
    format!("/local/domain/{backend_domid}/vrdma-stats")
}

/// `/local/domain/<B>/vrdma-stats/<D>/<devid>`: the counters of one device.
pub fn device_stats_path(backend_domid: u32, id: DeviceId) -> String {
    format!("{}/{}/{}", stats_root(backend_domid), id.domid, id.devid)
}

/// `/local/domain/<D>/device/vrdma/<devid>`.
pub fn device_frontend_path(id: DeviceId) -> String {
    format!("/local/domain/{}/device/vrdma/{}", id.domid, id.devid)
}

/// A decimal XenStore path component (domid, devid, channel number): no sign, no leading
/// zeros, fits in `u32`.
pub(crate) fn parse_index(name: &str) -> Option<u32> {
    if name.is_empty() || name.len() > 10 || (name.len() > 1 && name.starts_with('0')) {
        return None;
    }
    if !name.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    name.parse().ok()
}

/// The device a path under the backend root belongs to: `<root>/<D>/<devid>[/...]`.
pub(crate) fn device_of(root: &str, path: &str) -> Option<DeviceId> {
    let rest = path.strip_prefix(root)?.strip_prefix('/')?;
    let mut parts = rest.split('/');
    let domid = parse_index(parts.next()?)?;
    let devid = parse_index(parts.next()?)?;
    Some(DeviceId { domid, devid })
}

/// Children of `path`, none if it does not exist.
pub(super) fn list(store: &dyn XenbusStore, path: &str) -> Result<Vec<String>> {
    match store.directory(path) {
        Ok(v) => Ok(v),
        Err(e) if e.is_not_found() => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// A `0`/`1` node; missing or anything else is false.
pub(super) fn read_flag(store: &dyn NodeOps, path: &str) -> Result<bool> {
    Ok(store
        .read_opt(path)?
        .is_some_and(|v| v.trim_ascii() == b"1"))
}

/// For `.or_else`: a node that is already gone is not an error.
pub(super) fn ignore_enoent(e: xenstore_proto::client::Error) -> Result<()> {
    if e.is_not_found() {
        Ok(())
    } else {
        Err(e)
    }
}

/// Reads a channel node's `nonce` (absent, or not text: `None`).
pub(super) fn read_nonce(store: &dyn XenbusStore, chan_path: &str) -> Result<Option<String>> {
    Ok(store
        .read_opt(&ChannelKey::Nonce.path(chan_path))?
        .and_then(|v| String::from_utf8(v).ok()))
}

/// Writes (or removes) the backend channel node's `nonce` in a transaction.
pub(super) fn write_nonce(t: &dyn NodeOps, bpath: &str, nonce: Option<&str>) -> Result<()> {
    let p = ChannelKey::Nonce.path(bpath);
    match nonce {
        Some(v) => t.write(&p, v.as_bytes()),
        None if t.exists(&p)? => t.rm(&p),
        None => Ok(()),
    }
}

/// Reads device `id`'s quotas from its backend node `base` (the toolstack owns them); missing
/// or unreadable keys take `defaults`.
pub(super) fn read_quotas(
    store: &dyn XenbusStore,
    base: &str,
    defaults: Quotas,
    id: DeviceId,
) -> Result<Quotas> {
    let mut q = defaults;
    for r in Resource::ALL {
        let path = format!("{base}/{}", r.quota_key());
        if let Some(v) = store.read_opt(&path)? {
            match std::str::from_utf8(&v)
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                Some(v) => q.set(r, v),
                None => tracing::warn!(
                    device = %id,
                    "{path} = {:?} is not a number; using the default {}",
                    String::from_utf8_lossy(&v),
                    q.get(r)
                ),
            }
        }
    }
    Ok(q)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexes_are_canonical_decimals() {
        assert_eq!(parse_index("0"), Some(0));
        assert_eq!(parse_index("17"), Some(17));
        for bad in ["", "01", "-1", "+1", "x", "99999999999", "1 "] {
            assert_eq!(parse_index(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn device_of_paths() {
        let root = backend_root(0);
        let id = DeviceId { domid: 3, devid: 0 };
        assert_eq!(device_of(&root, &format!("{root}/3/0/state")), Some(id));
        assert_eq!(device_of(&root, &format!("{root}/3/0")), Some(id));
        assert_eq!(device_of(&root, &format!("{root}/3")), None);
        assert_eq!(device_of(&root, &root), None);
        assert_eq!(device_of(&root, "/local/domain/0/backend/vrdmax/3/0"), None);
        assert_eq!(
            device_backend_path(0, id),
            "/local/domain/0/backend/vrdma/3/0"
        );
        assert_eq!(device_frontend_path(id), "/local/domain/3/device/vrdma/0");
        assert_eq!(device_stats_path(0, id), "/local/domain/0/vrdma-stats/3/0");
        assert!(!device_stats_path(0, id).starts_with(&format!("{root}/")));
    }
}
