//! Reading vrdma devices back from XenStore for `vrdmactl list` and `vrdmactl stats`: the
//! devices under a backend's root, their states, quotas and channels, and the counters the
//! backend publishes for each device under `/local/domain/<B>/vrdma-stats/<D>/<devid>/`
//! (docs/backend.md, "Counters in XenStore").
//!
//! Reads are not in a transaction: a node that vanishes between a listing and its read is
//! simply shown as missing.
//!
//! Every text in a report (values, and the names of stats keys and groups) is escaped with
//! [`crate::escape`] as it is read: a guest writes its own nodes (`channel/<n>/mode` ...), and
//! what it wrote must reach the admin's terminal as visible text, never as escape sequences,
//! in the table and in `--json` alike.

use std::collections::BTreeMap;

use serde::Serialize;
use xenstore_proto::client::{NodeOps, Result};

use super::{device_paths, DevicePaths};
use crate::escape::{escape_bytes, escape_str};
use crate::resources::Resource;
use crate::xenbus::{backend_root, device_stats_path, DeviceId, XenbusState};

/// One device as `vrdmactl list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceReport {
    pub domid: u32,
    pub devid: u32,
    pub backend_domid: u32,
    pub backend_path: String,
    pub frontend_path: String,
    /// `/local/domain/<D>` exists (false: the domain is gone and the device is left over).
    pub domain_exists: bool,
    pub online: Option<bool>,
    pub backend_state: Option<u32>,
    pub frontend_state: Option<u32>,
    /// The device kind the backend published (`soft-iwarp`).
    pub kind: Option<String>,
    /// The `max-*` keys written at attach (absent ones take the daemon's defaults).
    pub quotas: BTreeMap<String, u64>,
    pub channels: Vec<ChannelReport>,
}

/// One channel of a device: both ends' view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChannelReport {
    pub channel: u32,
    pub frontend_state: Option<u32>,
    pub backend_state: Option<u32>,
    pub pid: Option<u32>,
    pub mode: Option<String>,
    /// The backend's error sentence for a refused or closed channel.
    pub error: Option<String>,
}

/// The counters of one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceStats {
    pub domid: u32,
    pub devid: u32,
    /// `<stats>/<key>`: resources held now (`channels`, `pds`, `mrs`, `mr-pages`, `cqs`, `qps`)
    /// and cumulative device counters (`ops`, `bytes`, `errors`, `notifications`, `events`).
    pub counters: BTreeMap<String, u64>,
    /// `<stats>/<group>/<id>/<key>`, e.g. per-QP counters under `<stats>/qp/<qpn>/` (`ops`,
    /// `bytes`, `errors`, `recvs` and the QP's `state`).
    pub groups: BTreeMap<String, BTreeMap<String, BTreeMap<String, StatValue>>>,
}

/// A value under `<stats>/<group>/<id>/`: a counter, or text such as a QP's state.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(untagged)]
pub enum StatValue {
    Number(u64),
    Text(String),
}

impl StatValue {
    fn parse(v: &str) -> StatValue {
        let v = v.trim();
        v.parse()
            .map_or_else(|_| StatValue::Text(escape_str(v)), StatValue::Number)
    }

    /// The counter, if it is one.
    pub fn number(&self) -> Option<u64> {
        match self {
            StatValue::Number(n) => Some(*n),
            StatValue::Text(_) => None,
        }
    }
}

impl std::fmt::Display for StatValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StatValue::Number(n) => n.fmt(f),
            StatValue::Text(t) => f.write_str(t),
        }
    }
}

impl DeviceStats {
    /// Resource counters first (in [`Resource::ALL`] order), then the rest by name.
    pub fn ordered_counters(&self) -> Vec<(&str, u64)> {
        let resources: Vec<&str> = Resource::ALL.iter().map(|r| r.stats_key()).collect();
        let mut out: Vec<(&str, u64)> = resources
            .iter()
            .filter_map(|k| self.counters.get(*k).map(|v| (*k, *v)))
            .collect();
        out.extend(
            self.counters
                .iter()
                .filter(|(k, _)| !resources.contains(&k.as_str()))
                .map(|(k, v)| (k.as_str(), *v)),
        );
        out
    }
}

/// Every device under backend domain `backend_domid`'s root, optionally of one guest only,
/// ordered by domain and device id.
pub fn list_devices(
    store: &dyn NodeOps,
    backend_domid: u32,
    only_domid: Option<u32>,
) -> Result<Vec<DeviceReport>> {
    let mut out = Vec::new();
    for (domid, devid) in device_ids(store, backend_domid, only_domid)? {
        out.push(device_report(store, backend_domid, domid, devid)?);
    }
    Ok(out)
}

/// `(domid, devid)` of every device under the backend root.
pub fn device_ids(
    store: &dyn NodeOps,
    backend_domid: u32,
    only_domid: Option<u32>,
) -> Result<Vec<(u32, u32)>> {
    let root = backend_root(backend_domid);
    let mut ids = Vec::new();
    for d in numeric_children(store, &root)? {
        if only_domid.is_some_and(|o| o != d) {
            continue;
        }
        for devid in numeric_children(store, &format!("{root}/{d}"))? {
            ids.push((d, devid));
        }
    }
    ids.sort_unstable();
    Ok(ids)
}

/// One device's report.
pub fn device_report(
    store: &dyn NodeOps,
    backend_domid: u32,
    domid: u32,
    devid: u32,
) -> Result<DeviceReport> {
    let DevicePaths { backend, frontend } = device_paths(domid, backend_domid, devid);
    let mut quotas = BTreeMap::new();
    for r in Resource::ALL {
        if let Some(v) = read_number(store, &format!("{backend}/{}", r.quota_key()))? {
            quotas.insert(r.quota_key().to_owned(), v);
        }
    }
    let mut numbers: Vec<u32> = numeric_children(store, &format!("{frontend}/channel"))?;
    numbers.extend(numeric_children(store, &format!("{backend}/channel"))?);
    numbers.sort_unstable();
    numbers.dedup();
    let mut channels = Vec::new();
    for n in numbers {
        let (fc, bc) = (
            format!("{frontend}/channel/{n}"),
            format!("{backend}/channel/{n}"),
        );
        channels.push(ChannelReport {
            channel: n,
            frontend_state: read_state(store, &format!("{fc}/state"))?,
            backend_state: read_state(store, &format!("{bc}/state"))?,
            pid: read_number(store, &format!("{fc}/pid"))?.and_then(|v| u32::try_from(v).ok()),
            mode: read_text(store, &format!("{fc}/mode"))?,
            error: read_text(store, &format!("{bc}/error"))?,
        });
    }
    Ok(DeviceReport {
        domid,
        devid,
        backend_domid,
        domain_exists: store.exists(&format!("/local/domain/{domid}"))?,
        online: read_raw(store, &format!("{backend}/online"))?.map(|v| v.trim() == "1"),
        backend_state: read_state(store, &format!("{backend}/state"))?,
        frontend_state: read_state(store, &format!("{frontend}/state"))?,
        kind: read_text(store, &format!("{backend}/kind"))?,
        quotas,
        channels,
        backend_path: backend,
        frontend_path: frontend,
    })
}

/// The counters of one device (empty if the backend has published none yet).
pub fn device_stats(
    store: &dyn NodeOps,
    backend_domid: u32,
    domid: u32,
    devid: u32,
) -> Result<DeviceStats> {
    let base = device_stats_path(backend_domid, DeviceId { domid, devid });
    let mut stats = DeviceStats {
        domid,
        devid,
        counters: BTreeMap::new(),
        groups: BTreeMap::new(),
    };
    for key in children(store, &base)? {
        let path = format!("{base}/{key}");
        if let Some(v) = read_number(store, &path)? {
            stats.counters.insert(escape_str(&key), v);
        }
        for id in children(store, &path)? {
            let mut counters = BTreeMap::new();
            for k in children(store, &format!("{path}/{id}"))? {
                if let Some(v) = read_raw(store, &format!("{path}/{id}/{k}"))? {
                    counters.insert(escape_str(&k), StatValue::parse(&v));
                }
            }
            if !counters.is_empty() {
                stats
                    .groups
                    .entry(escape_str(&key))
                    .or_default()
                    .insert(escape_str(&id), counters);
            }
        }
    }
    Ok(stats)
}

/// The name of a numeric xenbus state (`Connected`), or the number.
pub fn state_name(state: Option<u32>) -> String {
    match state {
        None => "-".into(),
        Some(n) => match XenbusState::parse(n.to_string().as_bytes()) {
            Some(s) => format!("{s:?}"),
            None => n.to_string(),
        },
    }
}

fn children(store: &dyn NodeOps, path: &str) -> Result<Vec<String>> {
    match store.directory(path) {
        Ok(v) => Ok(v),
        Err(e) if e.is_not_found() => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

fn numeric_children(store: &dyn NodeOps, path: &str) -> Result<Vec<u32>> {
    let mut v: Vec<u32> = children(store, path)?
        .iter()
        .filter(|c| !(c.len() > 1 && c.starts_with('0')))
        .filter_map(|c| c.parse().ok())
        .collect();
    v.sort_unstable();
    Ok(v)
}

/// A value as text to show: escaped (control characters, escape sequences, invisible
/// characters and bytes that are not UTF-8 become visible escapes).
fn read_text(store: &dyn NodeOps, path: &str) -> Result<Option<String>> {
    Ok(store.read_opt(path)?.map(|v| escape_bytes(&v)))
}

/// A value to interpret, not to show.
fn read_raw(store: &dyn NodeOps, path: &str) -> Result<Option<String>> {
    Ok(store
        .read_opt(path)?
        .map(|v| String::from_utf8_lossy(&v).into_owned()))
}

fn read_number(store: &dyn NodeOps, path: &str) -> Result<Option<u64>> {
    Ok(read_raw(store, path)?.and_then(|v| v.trim().parse().ok()))
}

fn read_state(store: &dyn NodeOps, path: &str) -> Result<Option<u32>> {
    Ok(read_number(store, path)?.and_then(|v| u32::try_from(v).ok()))
}
