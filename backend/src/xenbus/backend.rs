//! Device records and the device-level state machine.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use xenstore_proto::client::{NodeOps, Result, XenbusStore, XenbusStoreExt};

use super::channel::ChannelRecord;
use super::paths::{
    self, backend_root, device_backend_path, device_frontend_path, device_stats_path, stats_root,
};
use super::{ChannelOpener, CloseReason, DeviceId, XenbusState};
use crate::resources::{Account, Quotas, Resource};

/// What the backend publishes for every device before InitWait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Protocol versions spoken (`versions`, space separated).
    pub versions: Vec<u32>,
    /// Device kind (`kind`), e.g. `soft-iwarp`.
    pub kind: String,
    /// Device limits: `max-qp-wr`, `max-cqe`, `max-sge`, `max-inline`, `max-mr-size`.
    pub limits: Vec<(String, u64)>,
}

/// Extra counters of a domain to publish under `stats/`: the device's op/byte/error counters
/// and its per-QP counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// `stats/<key>`.
    pub counters: Vec<(&'static str, u64)>,
    /// `stats/qp/<qpn>/<key>`, one entry per live QP (a QP missing here has its directory
    /// removed).
    pub qps: BTreeMap<u32, BTreeMap<&'static str, String>>,
}

/// Where [`XenbusBackend::publish_stats`] gets a domain's device counters from.
pub type StatsSource = Box<dyn Fn(u32) -> StatsSnapshot + Send>;

pub(super) struct DeviceRecord {
    pub(super) id: DeviceId,
    pub(super) backend_path: String,
    pub(super) frontend_path: String,
    /// Where the device's counters are published (not under the watched root).
    pub(super) stats_path: String,
    /// The device state this backend last wrote (None: not yet).
    pub(super) written: Option<XenbusState>,
    pub(super) account: Arc<Account>,
    pub(super) channels: BTreeMap<u32, ChannelRecord>,
    /// The frontend's node has been seen (so its disappearance means the domain went).
    pub(super) frontend_seen: bool,
    /// Stats last published, to write only what changed.
    pub(super) published: BTreeMap<&'static str, u64>,
    /// Per-QP stats last published (`stats/qp/<qpn>/`).
    pub(super) published_qps: BTreeMap<u32, BTreeMap<&'static str, String>>,
}

impl DeviceRecord {
    pub(super) fn active(&self) -> bool {
        matches!(
            self.written,
            Some(XenbusState::InitWait | XenbusState::Connected)
        )
    }
}

/// The backend side of every vrdma device of this backend domain.
pub struct XenbusBackend {
    pub(super) store: Arc<dyn XenbusStore>,
    pub(super) backend_domid: u32,
    pub(super) root: String,
    pub(super) info: DeviceInfo,
    pub(super) defaults: Quotas,
    pub(super) opener: Box<dyn ChannelOpener>,
    pub(super) devices: BTreeMap<DeviceId, DeviceRecord>,
    on_account_change: Arc<dyn Fn(DeviceId) + Send + Sync>,
    stats_source: StatsSource,
}

impl XenbusBackend {
    /// A backend for domain `backend_domid`. `on_account_change` is called (from any thread)
    /// when a device's resource usage changes, so the daemon can have
    /// [`XenbusBackend::publish_stats`] run.
    pub fn new(
        store: Arc<dyn XenbusStore>,
        backend_domid: u32,
        info: DeviceInfo,
        defaults: Quotas,
        opener: Box<dyn ChannelOpener>,
        on_account_change: Arc<dyn Fn(DeviceId) + Send + Sync>,
        stats_source: StatsSource,
    ) -> XenbusBackend {
        XenbusBackend {
            store,
            backend_domid,
            root: backend_root(backend_domid),
            info,
            defaults,
            opener,
            devices: BTreeMap::new(),
            on_account_change,
            stats_source,
        }
    }

    /// The watched root, `/local/domain/<B>/backend/vrdma`.
    pub fn root(&self) -> &str {
        &self.root
    }

    /// The devices known now.
    pub fn devices(&self) -> Vec<DeviceId> {
        self.devices.keys().copied().collect()
    }

    /// The frontend path of every known device (the daemon watches them).
    pub fn frontend_paths(&self) -> Vec<(DeviceId, String)> {
        self.devices
            .values()
            .map(|d| (d.id, d.frontend_path.clone()))
            .collect()
    }

    /// The resource account of a device.
    pub fn account(&self, id: DeviceId) -> Option<Arc<Account>> {
        self.devices.get(&id).map(|d| d.account.clone())
    }

    /// Live channels of a device.
    pub fn live_channels(&self, id: DeviceId) -> Vec<u32> {
        self.devices
            .get(&id)
            .map(|d| {
                d.channels
                    .iter()
                    .filter(|(_, c)| c.is_live())
                    .map(|(&n, _)| n)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Looks at everything under the backend root: new devices are served, changed ones
    /// re-evaluated, removed ones reclaimed.
    pub fn scan(&mut self) -> Result<()> {
        let mut seen = BTreeSet::new();
        for dom in list(&*self.store, &self.root)? {
            let Some(domid) = paths::parse_index(&dom) else {
                continue;
            };
            for dev in list(&*self.store, &format!("{}/{dom}", self.root))? {
                let Some(devid) = paths::parse_index(&dev) else {
                    continue;
                };
                seen.insert(DeviceId { domid, devid });
            }
        }
        let gone: Vec<DeviceId> = self
            .devices
            .keys()
            .filter(|id| !seen.contains(id))
            .copied()
            .collect();
        for id in gone {
            self.vanished(id);
        }
        self.remove_stale_stats(&seen)?;
        for id in seen {
            self.evaluate(id)?;
        }
        Ok(())
    }

    /// Removes the counters of devices that no longer exist (detached while no backend ran).
    fn remove_stale_stats(&self, seen: &BTreeSet<DeviceId>) -> Result<()> {
        let root = stats_root(self.backend_domid);
        for dom in list(&*self.store, &root)? {
            let devs = list(&*self.store, &format!("{root}/{dom}"))?;
            let stale: Vec<&String> = devs
                .iter()
                .filter(|dev| {
                    let id = paths::parse_index(&dom)
                        .zip(paths::parse_index(dev))
                        .map(|(domid, devid)| DeviceId { domid, devid });
                    !id.is_some_and(|id| seen.contains(&id))
                })
                .collect();
            if stale.len() == devs.len() {
                self.store
                    .rm(&format!("{root}/{dom}"))
                    .or_else(ignore_enoent)?;
            } else {
                for dev in stale {
                    self.store
                        .rm(&format!("{root}/{dom}/{dev}"))
                        .or_else(ignore_enoent)?;
                }
            }
        }
        Ok(())
    }

    /// A watch fired on `path` under the backend root.
    pub fn on_backend_path(&mut self, path: &str) -> Result<()> {
        match paths::device_of(&self.root, path) {
            Some(id) => self.evaluate(id),
            None => self.scan(),
        }
    }

    /// `@releaseDomain` fired: every device whose frontend node went away with its domain is
    /// reclaimed at once.
    pub fn on_release_domain(&mut self) -> Result<()> {
        let ids: Vec<DeviceId> = self.devices.keys().copied().collect();
        for id in ids {
            let Some(dev) = self.devices.get(&id) else {
                continue;
            };
            if dev.frontend_seen && !self.store.exists(&dev.frontend_path)? {
                self.frontend_gone(id, CloseReason::DomainGone)?;
            }
        }
        Ok(())
    }

    /// Closes every channel politely (Closing, then Closed) and marks every device Closed:
    /// the backend is stopping.
    pub fn shutdown(&mut self) {
        let ids: Vec<DeviceId> = self.devices.keys().copied().collect();
        for id in ids {
            let n = self.close_all_channels(id, &CloseReason::Shutdown, true);
            if let Err(e) = self.write_device_state(id, XenbusState::Closed) {
                tracing::warn!(device = %id, "cannot mark the device Closed: {e}");
            }
            tracing::info!(device = %id, "device closed ({n} channels closed): backend stopping");
        }
        self.devices.clear();
    }

    /// (Re)evaluates one device from what XenStore says now.
    pub fn evaluate(&mut self, id: DeviceId) -> Result<()> {
        let base = device_backend_path(self.backend_domid, id);
        if !self.devices.contains_key(&id) {
            return self.discover(id);
        }
        let Some(state) = self.store.read_opt(&format!("{base}/state"))? else {
            // The toolstack removed the device (detach finished, or a plain rm).
            self.vanished(id);
            return Ok(());
        };
        let state = XenbusState::parse(&state);
        let online = read_flag(&*self.store, &format!("{base}/online"))?;
        let written = self.devices[&id].written;
        if state != written {
            match state {
                Some(XenbusState::Closing) => return self.detach(id),
                Some(XenbusState::Initialising) if online => {
                    self.publish_init_wait(id)?;
                }
                other => tracing::debug!(device = %id, "backend state is {other:?}, not ours"),
            }
        }
        if !online {
            return self.detach(id);
        }
        self.scan_frontend(id)
    }

    fn discover(&mut self, id: DeviceId) -> Result<()> {
        let base = device_backend_path(self.backend_domid, id);
        let frontend = self.store.read_opt(&format!("{base}/frontend"))?;
        let state = self.store.read_opt(&format!("{base}/state"))?;
        let (Some(frontend), Some(state)) = (frontend, state) else {
            tracing::debug!(device = %id, "incomplete device node; waiting for the toolstack");
            return Ok(());
        };
        let expected = device_frontend_path(id);
        let frontend_id = self.store.read_opt(&format!("{base}/frontend-id"))?;
        if frontend != expected.as_bytes()
            || frontend_id
                .as_deref()
                .and_then(|v| std::str::from_utf8(v).ok())
                .and_then(|v| v.trim().parse::<u32>().ok())
                != Some(id.domid)
        {
            tracing::warn!(
                device = %id,
                "frontend is {:?} (frontend-id {:?}), not {expected}; not serving it",
                String::from_utf8_lossy(&frontend),
                frontend_id.map(|v| String::from_utf8_lossy(&v).into_owned())
            );
            return Ok(());
        }
        let quotas = self.read_quotas(id)?;
        let notify = self.on_account_change.clone();
        let account = Account::new(id.domid, id.devid, quotas, Box::new(move || notify(id)));
        let mut record = DeviceRecord {
            id,
            backend_path: base.clone(),
            frontend_path: expected,
            stats_path: device_stats_path(self.backend_domid, id),
            written: None,
            account,
            channels: BTreeMap::new(),
            frontend_seen: false,
            published: BTreeMap::new(),
            published_qps: BTreeMap::new(),
        };
        let stale = self.close_stale_channels(&mut record)?;
        // Counters of an earlier backend process describe objects that are gone (and an older
        // backend published them in the device node itself).
        self.store.rm(&record.stats_path).or_else(ignore_enoent)?;
        self.store
            .rm(&format!("{base}/stats"))
            .or_else(ignore_enoent)?;
        self.devices.insert(id, record);
        let online = read_flag(&*self.store, &format!("{base}/online"))?;
        let state = XenbusState::parse(&state);
        tracing::info!(
            device = %id,
            "found device (state {state:?}, online {online}{})",
            if stale > 0 {
                format!(", {stale} channels of a previous backend closed")
            } else {
                String::new()
            }
        );
        if !online || state == Some(XenbusState::Closing) {
            return self.detach(id);
        }
        self.publish_init_wait(id)?;
        self.publish_stats(id)?;
        self.scan_frontend(id)
    }

    /// Channels in the backend node when a device is found were made by an earlier backend
    /// process: they are closed with "backend restarted", and forgotten once the frontend
    /// removes them.
    fn close_stale_channels(&self, record: &mut DeviceRecord) -> Result<usize> {
        let dir = format!("{}/channel", record.backend_path);
        let mut n_closed = 0;
        for name in list(&*self.store, &dir)? {
            let Some(n) = paths::parse_index(&name) else {
                continue;
            };
            let p = format!("{dir}/{name}");
            let state = self
                .store
                .read_opt(&format!("{p}/state"))?
                .and_then(|v| XenbusState::parse(&v));
            if state != Some(XenbusState::Closed) {
                self.store.transaction(|t| {
                    t.write(&format!("{p}/error"), b"backend restarted")?;
                    t.write(
                        &format!("{p}/state"),
                        XenbusState::Closed.value().as_bytes(),
                    )
                })?;
                tracing::info!(device = %record.id, channel = n, "stale channel closed: backend restarted");
                n_closed += 1;
            }
            let nonce = super::channel::read_nonce(&*self.store, &p)?;
            record.channels.insert(n, ChannelRecord::Closed(nonce));
        }
        Ok(n_closed)
    }

    /// Publishes `versions`, `kind`, limits and `state = 2` in one transaction.
    pub(super) fn publish_init_wait(&mut self, id: DeviceId) -> Result<()> {
        let base = device_backend_path(self.backend_domid, id);
        let versions = self
            .info
            .versions
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(" ");
        let info = &self.info;
        self.store.transaction(|t| {
            t.write(&format!("{base}/versions"), versions.as_bytes())?;
            t.write(&format!("{base}/kind"), info.kind.as_bytes())?;
            for (key, value) in &info.limits {
                t.write(&format!("{base}/{key}"), value.to_string().as_bytes())?;
            }
            t.write(
                &format!("{base}/state"),
                XenbusState::InitWait.value().as_bytes(),
            )
        })?;
        if let Some(d) = self.devices.get_mut(&id) {
            d.written = Some(XenbusState::InitWait);
        }
        tracing::info!(device = %id, "InitWait published (versions {versions}, kind {})", self.info.kind);
        Ok(())
    }

    pub(super) fn write_device_state(&mut self, id: DeviceId, state: XenbusState) -> Result<()> {
        let Some(d) = self.devices.get_mut(&id) else {
            return Ok(());
        };
        if d.written == Some(state) {
            return Ok(());
        }
        let path = format!("{}/state", d.backend_path);
        // Only while the node exists: the toolstack may have removed it already.
        let base = d.backend_path.clone();
        self.store.transaction(|t| {
            if t.exists(&base)? {
                t.write(&path, state.value().as_bytes())?;
            }
            Ok(())
        })?;
        d.written = Some(state);
        tracing::debug!(device = %id, "backend state {state}");
        Ok(())
    }

    /// The toolstack set `online = 0` / `state = 5`: close every channel, then Closed.
    fn detach(&mut self, id: DeviceId) -> Result<()> {
        if self.devices.get(&id).map(|d| d.written) == Some(Some(XenbusState::Closed)) {
            return Ok(());
        }
        let n = self.close_all_channels(id, &CloseReason::Detached, true);
        self.write_device_state(id, XenbusState::Closed)?;
        tracing::info!(device = %id, "device detached: {n} channels closed and reclaimed");
        Ok(())
    }

    /// The backend node is gone: reclaim what is left and forget the device.
    fn vanished(&mut self, id: DeviceId) {
        let n = self.close_all_channels(id, &CloseReason::Detached, false);
        if let Some(d) = self.devices.remove(&id) {
            debug_assert!(d.channels.values().all(|c| !c.is_live()));
            if let Err(e) = self.store.rm(&d.stats_path).or_else(ignore_enoent) {
                tracing::warn!(device = %id, "cannot remove {}: {e}", d.stats_path);
            }
        }
        tracing::info!(device = %id, "device removed by the toolstack ({n} channels reclaimed)");
    }

    /// The frontend node went away (domain released, or the toolstack removed it).
    pub(super) fn frontend_gone(&mut self, id: DeviceId, reason: CloseReason) -> Result<()> {
        let n = self.close_all_channels(id, &reason, false);
        let Some(d) = self.devices.get_mut(&id) else {
            return Ok(());
        };
        d.frontend_seen = false;
        let dir = format!("{}/channel", d.backend_path);
        d.channels.clear();
        self.store.rm(&dir).or_else(ignore_enoent)?;
        self.write_device_state(id, XenbusState::Closed)?;
        tracing::info!(device = %id, "frontend gone ({reason}): {n} channels reclaimed");
        Ok(())
    }

    /// Re-reads the quotas from the backend node (the toolstack owns them); missing or
    /// unreadable keys take the daemon's defaults.
    pub(super) fn read_quotas(&self, id: DeviceId) -> Result<Quotas> {
        let base = device_backend_path(self.backend_domid, id);
        let mut q = self.defaults;
        for r in Resource::ALL {
            let path = format!("{base}/{}", r.quota_key());
            if let Some(v) = self.store.read_opt(&path)? {
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

    /// Writes the device's counters under its stats node ([`device_stats_path`]; only those
    /// that changed), the per-QP counters under `qp/<qpn>/`, and removes the directories of
    /// QPs that are gone. Returns whether anything was written. The daemon paces the calls.
    pub fn publish_stats(&mut self, id: DeviceId) -> Result<bool> {
        let Some(d) = self.devices.get(&id) else {
            return Ok(false);
        };
        let usage = d.account.usage();
        let mut values: BTreeMap<&'static str, u64> = Resource::ALL
            .iter()
            .map(|&r| (r.stats_key(), usage.get(r)))
            .collect();
        let snapshot = (self.stats_source)(id.domid);
        for (k, v) in snapshot.counters {
            values.entry(k).or_insert(v);
        }
        let changed: Vec<(&'static str, u64)> = values
            .iter()
            .filter(|(k, v)| d.published.get(*k) != Some(*v))
            .map(|(k, v)| (*k, *v))
            .collect();
        let qps = snapshot.qps;
        let qp_changed: Vec<(u32, &'static str, &str)> = qps
            .iter()
            .flat_map(|(n, kv)| {
                let old = d.published_qps.get(n);
                kv.iter()
                    .filter(move |(k, v)| old.and_then(|o| o.get(*k)) != Some(*v))
                    .map(move |(k, v)| (*n, *k, v.as_str()))
            })
            .collect();
        let qp_gone: Vec<u32> = d
            .published_qps
            .keys()
            .filter(|n| !qps.contains_key(n))
            .copied()
            .collect();
        let all_gone = qps.is_empty() && !d.published_qps.is_empty();
        if changed.is_empty() && qp_changed.is_empty() && qp_gone.is_empty() {
            return Ok(false);
        }
        let base = d.backend_path.clone();
        let stats = d.stats_path.clone();
        let perms = crate::toolstack::backend_perms(id.domid, self.backend_domid);
        let wrote = self.store.transaction(|t| {
            if !t.exists(&base)? {
                return Ok(false);
            }
            if !t.exists(&stats)? {
                // Readable by the guest, as the device node is.
                t.mkdir(&stats)?;
                t.set_perms(&stats, &perms)?;
            }
            for (k, v) in &changed {
                t.write(&format!("{stats}/{k}"), v.to_string().as_bytes())?;
            }
            for (n, k, v) in &qp_changed {
                t.write(&format!("{stats}/qp/{n}/{k}"), v.as_bytes())?;
            }
            let gone = if all_gone {
                vec![format!("{stats}/qp")]
            } else {
                qp_gone.iter().map(|n| format!("{stats}/qp/{n}")).collect()
            };
            for p in gone {
                if t.exists(&p)? {
                    t.rm(&p)?;
                }
            }
            Ok(true)
        })?;
        if let Some(d) = self.devices.get_mut(&id) {
            d.published = values;
            d.published_qps = qps;
        }
        Ok(wrote)
    }
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

pub(super) fn ignore_enoent(e: xenstore_proto::client::Error) -> Result<()> {
    if e.is_not_found() {
        Ok(())
    } else {
        Err(e)
    }
}
