//! Device records and the device-level state machine: the backend node (InitWait, detach,
//! removal) and the frontend's device state. Each device's channels are a
//! [`DeviceChannels`](super::channel::DeviceChannels), called through its narrow interface.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use shared_ring::abi::xenstore::DeviceKey;
use xenstore_proto::client::{Result, XenbusStore, XenbusStoreExt};

use super::channel::DeviceChannels;
use super::paths::{
    self, backend_root, device_backend_path, device_frontend_path, device_stats_path,
    ignore_enoent, list, read_flag, stats_root,
};
use super::{ChannelFault, ChannelOpener, CloseReason, DeviceId, XenbusState};
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
    /// The backend's address guests give their peers (`address`), if it has one.
    pub address: Option<std::net::IpAddr>,
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

struct DeviceRecord {
    id: DeviceId,
    backend_path: String,
    frontend_path: String,
    /// Where the device's counters are published (not under the watched root).
    stats_path: String,
    /// The device state this backend last wrote (None: not yet).
    written: Option<XenbusState>,
    account: Arc<Account>,
    channels: DeviceChannels,
    /// The frontend's node has been seen (so its disappearance means the domain went).
    frontend_seen: bool,
    /// Stats last published, to write only what changed.
    published: BTreeMap<&'static str, u64>,
    /// Per-QP stats last published (`stats/qp/<qpn>/`).
    published_qps: BTreeMap<u32, BTreeMap<&'static str, String>>,
}

impl DeviceRecord {
    fn active(&self) -> bool {
        matches!(
            self.written,
            Some(XenbusState::InitWait | XenbusState::Connected)
        )
    }
}

/// The backend side of every vrdma device of this backend domain.
pub struct XenbusBackend {
    store: Arc<dyn XenbusStore>,
    backend_domid: u32,
    root: String,
    info: DeviceInfo,
    defaults: Quotas,
    opener: Box<dyn ChannelOpener>,
    devices: BTreeMap<DeviceId, DeviceRecord>,
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
            .map(|d| d.channels.live())
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
        let Some(state) = self.store.read_opt(&DeviceKey::State.path(&base))? else {
            // The toolstack removed the device (detach finished, or a plain rm).
            self.vanished(id);
            return Ok(());
        };
        let state = XenbusState::parse(&state);
        let online = read_flag(&*self.store, &DeviceKey::Online.path(&base))?;
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
        let frontend = self.store.read_opt(&DeviceKey::Frontend.path(&base))?;
        let state = self.store.read_opt(&DeviceKey::State.path(&base))?;
        let (Some(frontend), Some(state)) = (frontend, state) else {
            tracing::debug!(device = %id, "incomplete device node; waiting for the toolstack");
            return Ok(());
        };
        let expected = device_frontend_path(id);
        let frontend_id = self.store.read_opt(&DeviceKey::FrontendId.path(&base))?;
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
            frontend_path: expected.clone(),
            stats_path: device_stats_path(self.backend_domid, id),
            written: None,
            account: account.clone(),
            channels: DeviceChannels::new(id, expected, base.clone(), account),
            frontend_seen: false,
            published: BTreeMap::new(),
            published_qps: BTreeMap::new(),
        };
        let stale = record.channels.adopt_stale(&*self.store)?;
        // Counters of an earlier backend process describe objects that are gone (and an older
        // backend published them in the device node itself).
        self.store.rm(&record.stats_path).or_else(ignore_enoent)?;
        self.store
            .rm(&format!("{base}/stats"))
            .or_else(ignore_enoent)?;
        self.devices.insert(id, record);
        let online = read_flag(&*self.store, &DeviceKey::Online.path(&base))?;
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

    /// Publishes `versions`, `kind`, limits and `state = 2` in one transaction.
    fn publish_init_wait(&mut self, id: DeviceId) -> Result<()> {
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
            t.write(&DeviceKey::Versions.path(&base), versions.as_bytes())?;
            t.write(&DeviceKey::Kind.path(&base), info.kind.as_bytes())?;
            for (key, value) in &info.limits {
                t.write(&format!("{base}/{key}"), value.to_string().as_bytes())?;
            }
            if let Some(a) = info.address {
                t.write(&DeviceKey::Address.path(&base), a.to_string().as_bytes())?;
            }
            t.write(
                &DeviceKey::State.path(&base),
                XenbusState::InitWait.value().as_bytes(),
            )
        })?;
        if let Some(d) = self.devices.get_mut(&id) {
            d.written = Some(XenbusState::InitWait);
        }
        tracing::info!(device = %id, "InitWait published (versions {versions}, kind {})", self.info.kind);
        Ok(())
    }

    fn write_device_state(&mut self, id: DeviceId, state: XenbusState) -> Result<()> {
        let Some(d) = self.devices.get_mut(&id) else {
            return Ok(());
        };
        if d.written == Some(state) {
            return Ok(());
        }
        let path = DeviceKey::State.path(&d.backend_path);
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
            debug_assert!(d.channels.live().is_empty());
            if let Err(e) = self.store.rm(&d.stats_path).or_else(ignore_enoent) {
                tracing::warn!(device = %id, "cannot remove {}: {e}", d.stats_path);
            }
        }
        tracing::info!(device = %id, "device removed by the toolstack ({n} channels reclaimed)");
    }

    /// The frontend node went away (domain released, or the toolstack removed it).
    fn frontend_gone(&mut self, id: DeviceId, reason: CloseReason) -> Result<()> {
        let n = self.close_all_channels(id, &reason, false);
        let Some(d) = self.devices.get_mut(&id) else {
            return Ok(());
        };
        d.frontend_seen = false;
        d.channels.forget_all(&*self.store)?;
        self.write_device_state(id, XenbusState::Closed)?;
        tracing::info!(device = %id, "frontend gone ({reason}): {n} channels reclaimed");
        Ok(())
    }

    /// A watch fired on the device's frontend node: follow the device state and its channels.
    pub fn scan_frontend(&mut self, id: DeviceId) -> Result<()> {
        let Some(dev) = self.devices.get(&id) else {
            return Ok(());
        };
        let fpath = dev.frontend_path.clone();
        let Some(fstate) = self.store.read_opt(&DeviceKey::State.path(&fpath))? else {
            if dev.frontend_seen {
                return self.frontend_gone(id, CloseReason::DomainGone);
            }
            return Ok(());
        };
        if let Some(d) = self.devices.get_mut(&id) {
            d.frontend_seen = true;
        }
        let fstate = XenbusState::parse(&fstate);
        let written = self.devices[&id].written;
        match fstate {
            Some(XenbusState::Connected) if written == Some(XenbusState::InitWait) => {
                self.write_device_state(id, XenbusState::Connected)?;
                tracing::info!(device = %id, "frontend driver present: device Connected");
            }
            Some(XenbusState::Closing)
                if matches!(
                    written,
                    Some(XenbusState::InitWait | XenbusState::Connected)
                ) =>
            {
                let n = self.close_all_channels(id, &CloseReason::Frontend, true);
                self.write_device_state(id, XenbusState::Closing)?;
                tracing::info!(device = %id, "frontend closing the device: {n} channels closed");
            }
            Some(XenbusState::Closed) if written != Some(XenbusState::Closed) => {
                let n = self.close_all_channels(id, &CloseReason::Frontend, true);
                self.write_device_state(id, XenbusState::Closed)?;
                tracing::info!(device = %id, "frontend closed the device: {n} channels closed");
            }
            Some(XenbusState::Initialising | XenbusState::InitWait)
                if matches!(written, Some(XenbusState::Closing | XenbusState::Closed)) =>
            {
                // The frontend starts over after a close; serve it again if still online.
                let base = self.devices[&id].backend_path.clone();
                if read_flag(&*self.store, &DeviceKey::Online.path(&base))? {
                    tracing::info!(device = %id, "frontend re-initialising the device");
                    self.publish_init_wait(id)?;
                }
            }
            _ => {}
        }
        let Some(d) = self.devices.get_mut(&id) else {
            return Ok(());
        };
        let active = d.active();
        d.channels
            .scan(&*self.store, &mut *self.opener, self.defaults, active)
    }

    /// Closes every live channel of a device; with `polite`, each gets Closing then Closed
    /// (and an error naming the reason) in the backend node.
    fn close_all_channels(&mut self, id: DeviceId, reason: &CloseReason, polite: bool) -> usize {
        match self.devices.get_mut(&id) {
            Some(d) => d.channels.close_all(&*self.store, reason, polite),
            None => 0,
        }
    }

    /// A live channel reported a fault (from its control service, through the daemon).
    pub fn channel_fault(&mut self, id: DeviceId, n: u32, fault: ChannelFault) -> Result<()> {
        match self.devices.get_mut(&id) {
            Some(d) => d.channels.fault(&*self.store, n, fault),
            None => Ok(()),
        }
    }

    /// Re-reads the quotas from the backend node (the toolstack owns them); missing or
    /// unreadable keys take the daemon's defaults.
    fn read_quotas(&self, id: DeviceId) -> Result<Quotas> {
        let base = device_backend_path(self.backend_domid, id);
        paths::read_quotas(&*self.store, &base, self.defaults, id)
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
