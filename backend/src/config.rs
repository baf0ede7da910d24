//! The daemon's configuration file (TOML, every key optional):
//!
//! ```toml
//! log-level = "info"          # tracing filter (RUST_LOG, when set, wins)
//! engine-threads = 1          # software device engine threads
//! spin-before-sleep-us = 200  # how long an idle engine polls before it sleeps
//! device = "soft"             # "soft" (the software device), or "verbs:<ibdev>[:<port>]":
//!                             # an RDMA device of this host through rdma-core (port 1 default)
//!
//! [quotas]                    # per guest device, when the backend node has no max-* key
//! max-channels = 16
//! max-pds = 64
//! max-mrs = 1024
//! max-mr-pages = 262144
//! max-cqs = 256
//! max-qps = 256
//! max-granted-pages = 4096
//!
//! [host]                      # host-wide page budgets, split fairly among guests
//! guests = 8                  # each domain may hold 1/guests of each budget
//! # granted-pages = 16384     # default: the platform's grant limit (gntalloc `limit`)
//! mapped-pages = 131072       # guest pages mapped (MRs), all guests together
//! maptrack-entries = 524288   # dom0's maptrack: gnttab_max_maptrack_frames × 512
//!
//! address = ["127.0.0.2"]     # the backend's address(es); default: 127.0.0.1 on the
//!                             # simulated host, none (intra-host only) on real Xen
//!
//! [cm]                        # connection management, per guest domain
//! max-listeners = 16          # listeners a domain holds, all its channels together
//! max-connects = 16           # connects in flight (not yet established or failed)
//! connect-timeout-ms = 10000  # a connect without an answer is unreachable after this
//! crc = "offer"               # MPA CRC: "offer" (ask, accept a peer that declines),
//!                             # "require" (refuse peers without it), "decline" (siw's default)
//! peer-probe-s = 10           # an iWARP stream idle this long probes its peer host (TCP
//!                             # keepalive every peer-probe-s/4, user timeout 2 × peer-probe-s):
//!                             # a dead peer is noticed ~2 × this later; 4..=3600
//! # allowed-ports = [4791, "18515-18520"]      # ports a domain may listen on (default: any
//! #                                            # port from 1024 up)
//! # allowed-peers = ["127.0.0.0/8", "fd00::/8"] # addresses a domain may connect to and
//! #                                            # accept from (default: any)
//!
//! [cm.domain.7]               # domain 7: max-listeners, max-connects, allowed-ports and
//!                             # allowed-peers, overriding [cm]
//! allowed-ports = ["5000-5009"]
//! ```

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use xen_platform::xen::limits::{
    GrantLimits, DEFAULT_GNTALLOC_LIMIT, DEFAULT_MAPTRACK_FRAMES, MAPTRACK_ENTRIES_PER_FRAME,
    MAPTRACK_ENTRIES_PER_MAPPED_PAGE,
};
use xen_platform::Platform;

use crate::device::EngineConfig;
use crate::resources::budget::BudgetLimits;
use crate::resources::Quotas;

/// The backend's address on the simulated host when the configuration names none.
pub const SIM_DEFAULT_ADDRESS: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

/// Where the configuration file is looked for when `--config` is not given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/vrdma/backend.toml";

/// The daemon's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct Config {
    /// A `tracing` filter: `info`, `debug`, `vrdma_backend=trace,info`, ...
    pub log_level: String,
    /// Engine threads of the software device (at least 1).
    pub engine_threads: usize,
    /// Microseconds an idle engine keeps polling doorbells before it sleeps.
    pub spin_before_sleep_us: u64,
    /// Default quotas of a guest device (the backend node's `max-*` keys override them).
    pub quotas: Quotas,
    /// Host-wide page budgets.
    pub host: HostConfig,
    /// The backend's addresses (the software device's, for connection management): the
    /// first is published to guests (XenStore `address`). Empty: the platform's default
    /// ([`Config::addresses`]).
    pub address: Vec<IpAddr>,
    /// Connection management: per-domain quotas, allowed ports and peers.
    pub cm: CmSettings,
    /// Which device serves the guests: `soft` or `verbs:<ibdev>[:<port>]` ([`DeviceChoice`]).
    pub device: String,
}

/// The device the daemon drives (`device = ...`, `vrdma-backend --device ...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceChoice {
    /// The software device (iWARP over TCP between hosts).
    Soft,
    /// An RDMA device of this host through rdma-core's libibverbs.
    Verbs { ibdev: String, port: u8 },
}

impl std::str::FromStr for DeviceChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "soft" {
            return Ok(DeviceChoice::Soft);
        }
        let Some(rest) = s.strip_prefix("verbs:") else {
            return Err(format!(
                "device {s:?}: expected \"soft\" or \"verbs:<ibdev>[:<port>]\""
            ));
        };
        let (ibdev, port) = match rest.split_once(':') {
            None => (rest, 1),
            Some((d, p)) => (
                d,
                p.parse::<u8>()
                    .ok()
                    .filter(|&p| p > 0)
                    .ok_or_else(|| format!("device {s:?}: port {p:?} is not 1..=255"))?,
            ),
        };
        if ibdev.is_empty() || ibdev.len() > 63 || ibdev.contains(['/', '\0']) {
            return Err(format!(
                "device {s:?}: {ibdev:?} is not an RDMA device name"
            ));
        }
        Ok(DeviceChoice::Verbs {
            ibdev: ibdev.to_owned(),
            port,
        })
    }
}

/// `[cm]`: what a guest domain may do with the connection manager. The keys are defaults;
/// `[cm.domain.<domid>]` overrides any of them for one domain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct CmSettings {
    /// Listeners one domain may hold (all its devices and channels together).
    pub max_listeners: u32,
    /// Connects one domain may have in flight (issued, not yet established or failed).
    pub max_connects: u32,
    /// How long a connect waits for the peer's answer before it is unreachable.
    pub connect_timeout_ms: u64,
    /// MPA CRC policy of connections to and from other hosts.
    pub crc: MpaCrc,
    /// Seconds an iWARP stream to another host may be silent before its peer is probed
    /// (TCP keepalive, then every quarter of it, four probes; the user timeout for
    /// unacknowledged bytes is twice it): a peer host that died without a FIN or RST is
    /// noticed about twice this later.
    pub peer_probe_s: u64,
    /// Ports a domain may listen on (single ports or `"lo-hi"` ranges); absent: any port
    /// from 1024 up (ports below 1024 only when listed).
    pub allowed_ports: Option<Vec<PortRange>>,
    /// Addresses (or `addr/prefix` networks) a domain may connect to and accept connections
    /// from; absent: any.
    pub allowed_peers: Option<Vec<IpNet>>,
    /// Per-domain overrides, by domain id.
    pub domain: BTreeMap<String, CmDomainSettings>,
}

impl Default for CmSettings {
    fn default() -> Self {
        CmSettings {
            max_listeners: 16,
            max_connects: 16,
            connect_timeout_ms: 10_000,
            crc: MpaCrc::Offer,
            peer_probe_s: DEFAULT_PEER_PROBE_S,
            allowed_ports: None,
            allowed_peers: None,
            domain: BTreeMap::new(),
        }
    }
}

/// `[cm] peer-probe-s` when the file has none (the data path's own default).
pub const DEFAULT_PEER_PROBE_S: u64 = 10;

/// Shortest `[cm] peer-probe-s`: the probes are a quarter of it apart, and TCP counts that
/// interval in whole seconds (at least 1).
pub const MIN_PEER_PROBE_S: u64 = 4;

/// Longest `[cm] peer-probe-s` (one hour).
pub const MAX_PEER_PROBE_S: u64 = 3600;

/// `[cm] crc`: the MPA CRC policy (see [`crate::device::CrcPolicy`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MpaCrc {
    /// Ask for CRC; accept a peer that declines.
    #[default]
    Offer,
    /// Ask for CRC; refuse a peer that declines.
    Require,
    /// Do not ask (use it when the peer asks, as RFC 5044 requires).
    Decline,
}

impl From<MpaCrc> for crate::device::CrcPolicy {
    fn from(c: MpaCrc) -> Self {
        match c {
            MpaCrc::Offer => crate::device::CrcPolicy::Offer,
            MpaCrc::Require => crate::device::CrcPolicy::Require,
            MpaCrc::Decline => crate::device::CrcPolicy::Decline,
        }
    }
}

/// `[cm.domain.<domid>]`: the keys that override `[cm]` for one domain.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct CmDomainSettings {
    pub max_listeners: Option<u32>,
    pub max_connects: Option<u32>,
    pub allowed_ports: Option<Vec<PortRange>>,
    pub allowed_peers: Option<Vec<IpNet>>,
}

/// The connection-management rules of one domain (`[cm]` with its `[cm.domain.<domid>]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmRules {
    pub max_listeners: u32,
    pub max_connects: u32,
    pub allowed_ports: Option<Vec<PortRange>>,
    pub allowed_peers: Option<Vec<IpNet>>,
}

/// Lowest port a domain may listen on when `allowed-ports` does not list it.
pub const FIRST_UNPRIVILEGED_PORT: u16 = 1024;

impl CmRules {
    /// Whether the domain may listen on `port` (not 0).
    pub fn port_allowed(&self, port: u16) -> bool {
        match &self.allowed_ports {
            Some(list) => list.iter().any(|r| r.contains(port)),
            None => port >= FIRST_UNPRIVILEGED_PORT,
        }
    }

    /// Whether the domain may connect to, or accept a connection from, `ip`.
    pub fn peer_allowed(&self, ip: IpAddr) -> bool {
        match &self.allowed_peers {
            Some(list) => list.iter().any(|n| n.contains(ip)),
            None => true,
        }
    }
}

impl CmSettings {
    /// The rules of domain `domid`.
    pub fn rules(&self, domid: u32) -> CmRules {
        let o = self.domain.get(&domid.to_string());
        CmRules {
            max_listeners: o
                .and_then(|o| o.max_listeners)
                .unwrap_or(self.max_listeners),
            max_connects: o.and_then(|o| o.max_connects).unwrap_or(self.max_connects),
            allowed_ports: o
                .and_then(|o| o.allowed_ports.clone())
                .or_else(|| self.allowed_ports.clone()),
            allowed_peers: o
                .and_then(|o| o.allowed_peers.clone())
                .or_else(|| self.allowed_peers.clone()),
        }
    }

    /// The connect timeout.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }

    /// The idle time before a silent peer host is probed.
    pub fn peer_probe(&self) -> Duration {
        Duration::from_secs(self.peer_probe_s)
    }

    fn validate(&self) -> Result<(), String> {
        for key in self.domain.keys() {
            if key.parse::<u16>().is_err() {
                return Err(format!(
                    "[cm.domain.{key}]: {key:?} is not a domain id (0..=65535)"
                ));
            }
        }
        if self.connect_timeout_ms == 0 || self.connect_timeout_ms > 3_600_000 {
            return Err("[cm] connect-timeout-ms must be between 1 and 3600000 (1 h)".into());
        }
        if !(MIN_PEER_PROBE_S..=MAX_PEER_PROBE_S).contains(&self.peer_probe_s) {
            return Err(format!(
                "[cm] peer-probe-s must be between {MIN_PEER_PROBE_S} and {MAX_PEER_PROBE_S} \
                 seconds (the keepalive probes are a quarter of it apart, at least 1 s), not {}",
                self.peer_probe_s
            ));
        }
        Ok(())
    }
}

/// A port or an inclusive range of ports: `4791` or `"5000-5009"` in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "PortSpec", into = "PortSpec")]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    pub fn contains(&self, port: u16) -> bool {
        (self.first..=self.last).contains(&port)
    }
    /// The ports of the range, first to last.
    pub fn ports(&self) -> impl Iterator<Item = u16> {
        self.first..=self.last
    }
}

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum PortSpec {
    One(u16),
    Text(String),
}

impl TryFrom<PortSpec> for PortRange {
    type Error = String;
    fn try_from(s: PortSpec) -> Result<PortRange, String> {
        let (first, last) = match s {
            PortSpec::One(p) => (p, p),
            PortSpec::Text(t) => {
                let port = |x: &str| {
                    x.trim()
                        .parse::<u16>()
                        .map_err(|_| format!("{t:?} is not a port or a range lo-hi"))
                };
                match t.split_once('-') {
                    Some((a, b)) => (port(a)?, port(b)?),
                    None => (port(&t)?, port(&t)?),
                }
            }
        };
        if first == 0 || first > last {
            return Err(format!(
                "port range {first}-{last} is empty or includes port 0"
            ));
        }
        Ok(PortRange { first, last })
    }
}

impl From<PortRange> for PortSpec {
    fn from(r: PortRange) -> PortSpec {
        if r.first == r.last {
            PortSpec::One(r.first)
        } else {
            PortSpec::Text(format!("{}-{}", r.first, r.last))
        }
    }
}

/// An address or a network (`"127.0.0.0/8"`, `"::1"`). IPv4-mapped IPv6 addresses count as
/// IPv4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct IpNet {
    pub addr: IpAddr,
    pub prefix: u8,
}

/// `ip` with an IPv4-mapped IPv6 address turned into IPv4.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

impl IpNet {
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, canonical_ip(ip)) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

impl TryFrom<String> for IpNet {
    type Error = String;
    fn try_from(s: String) -> Result<IpNet, String> {
        let bad = || format!("{s:?} is not an address or addr/prefix");
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s.as_str(), None),
        };
        let addr = canonical_ip(a.trim().parse::<IpAddr>().map_err(|_| bad())?);
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            Some(p) => p.trim().parse::<u8>().map_err(|_| bad())?,
            None => max,
        };
        if prefix > max {
            return Err(format!("{s:?}: prefix {prefix} is longer than {max}"));
        }
        Ok(IpNet { addr, prefix })
    }
}

impl From<IpNet> for String {
    fn from(n: IpNet) -> String {
        format!("{}/{}", n.addr, n.prefix)
    }
}

/// The host-wide page budgets (`[host]`), split fairly among guest domains: one domain may
/// hold at most `1/guests` of each (see [`crate::resources::budget`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct HostConfig {
    /// Guest domains the budgets are split among.
    pub guests: u32,
    /// Pages the backend may grant to all guests together; default: the platform's grant
    /// limit (gntalloc's `limit`, the simulated dom0's grant limit).
    pub granted_pages: Option<u64>,
    /// Guest pages the backend may map (MR pages), all guests together.
    pub mapped_pages: u64,
    /// dom0's maptrack entries (`gnttab_max_maptrack_frames` × 512); Xen does not show it to
    /// dom0 without hypfs, so it is stated here.
    pub maptrack_entries: u64,
}

impl Default for HostConfig {
    fn default() -> Self {
        let maptrack_entries = DEFAULT_MAPTRACK_FRAMES * MAPTRACK_ENTRIES_PER_FRAME;
        HostConfig {
            guests: 8,
            granted_pages: None,
            // Half of what the default maptrack can hold: the other half is for blkback,
            // netback and the rest of dom0.
            mapped_pages: maptrack_entries / MAPTRACK_ENTRIES_PER_MAPPED_PAGE / 2,
            maptrack_entries,
        }
    }
}

impl HostConfig {
    /// The budgets on a host with these limits, or why the configuration oversubscribes them.
    pub fn budget(&self, limits: &GrantLimits) -> Result<BudgetLimits, String> {
        if self.guests == 0 {
            return Err("[host] guests must be at least 1".into());
        }
        let granted = match (&limits.grant_pages, self.granted_pages) {
            (Some(l), Some(g)) if g > l.value => {
                return Err(format!(
                    "[host] granted-pages = {g} oversubscribes the host: {} is {}; lower                      [host] granted-pages or raise the limit",
                    l.knob, l.value
                ))
            }
            (_, Some(g)) => g,
            (Some(l), None) => l.value,
            (None, None) => DEFAULT_GNTALLOC_LIMIT,
        };
        let maptrack_needed = self
            .mapped_pages
            .saturating_mul(MAPTRACK_ENTRIES_PER_MAPPED_PAGE);
        if maptrack_needed > self.maptrack_entries {
            return Err(format!(
                "[host] mapped-pages = {} oversubscribes dom0's maptrack: mapping them takes up                  to {maptrack_needed} entries ({MAPTRACK_ENTRIES_PER_MAPPED_PAGE} per page) and                  [host] maptrack-entries is {} (Xen's gnttab_max_maptrack_frames ×                  {MAPTRACK_ENTRIES_PER_FRAME}); lower [host] mapped-pages",
                self.mapped_pages, self.maptrack_entries
            ));
        }
        let budget = BudgetLimits {
            granted_pages: granted,
            mapped_pages: self.mapped_pages,
            guests: self.guests,
        };
        // A channel's Init grants a doorbell and an event-ring page.
        if budget.share(crate::resources::budget::Pool::Granted) < 2 {
            return Err(format!(
                "[host] granted-pages = {granted} split among [host] guests = {} leaves each                  guest fewer than the 2 pages one channel needs",
                self.guests
            ));
        }
        Ok(budget)
    }

    /// [`HostConfig::budget`] on `platform`'s limits; a configuration the host cannot honour
    /// is logged and leaves the host budgets unbounded (library embedders; the daemon refuses
    /// such a configuration at start instead).
    pub fn budget_or_unlimited(&self, platform: &Platform) -> BudgetLimits {
        self.budget(&platform.grant_limits()).unwrap_or_else(|e| {
            tracing::warn!("host page budgets not enforced: {e}");
            BudgetLimits::UNLIMITED
        })
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            log_level: "info".into(),
            engine_threads: 1,
            spin_before_sleep_us: 200,
            quotas: Quotas::default(),
            host: HostConfig::default(),
            address: Vec::new(),
            cm: CmSettings::default(),
            device: "soft".into(),
        }
    }
}

/// A configuration file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Parse {
        path: String,
        source: toml::de::Error,
    },
    #[error("{path}: {what}")]
    Invalid { path: String, what: String },
}

impl Config {
    /// Parses TOML text (`origin` names it in errors).
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|source| ConfigError::Parse {
            path: origin.to_owned(),
            source,
        })?;
        config.validate(origin)?;
        Ok(config)
    }

    /// Reads and parses a file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Config::parse(&text, &path.display().to_string())
    }

    /// `path` if given (it must exist), else [`DEFAULT_CONFIG_PATH`] if it exists, else the
    /// defaults.
    pub fn load_or_default(path: Option<&Path>) -> Result<Config, ConfigError> {
        match path {
            Some(p) => Config::load(p),
            None if Path::new(DEFAULT_CONFIG_PATH).exists() => {
                Config::load(Path::new(DEFAULT_CONFIG_PATH))
            }
            None => Ok(Config::default()),
        }
    }

    fn validate(&self, origin: &str) -> Result<(), ConfigError> {
        let invalid = |what: &str| ConfigError::Invalid {
            path: origin.to_owned(),
            what: what.to_owned(),
        };
        if self.engine_threads == 0 || self.engine_threads > 256 {
            return Err(invalid("engine-threads must be between 1 and 256"));
        }
        self.device_choice().map_err(|e| invalid(&e))?;
        if self.spin_before_sleep_us > 10_000_000 {
            return Err(invalid(
                "spin-before-sleep-us must be at most 10000000 (10 s)",
            ));
        }
        // What can be checked without the host's limits (they are checked at start).
        let unknown_host = GrantLimits {
            grant_pages: Some(xen_platform::xen::limits::HostLimit {
                value: u64::MAX,
                knob: "the host's grant limit".into(),
            }),
        };
        self.host.budget(&unknown_host).map_err(|e| invalid(&e))?;
        self.cm.validate().map_err(|e| invalid(&e))?;
        if self
            .address
            .iter()
            .any(|a| a.is_unspecified() || a.is_multicast())
        {
            return Err(invalid(
                "address: every address must be a unicast address of this host",
            ));
        }
        Ok(())
    }

    /// The backend's addresses: `address`, or `default` (the platform's: 127.0.0.1 on the
    /// simulated host) when the file names none.
    pub fn addresses(&self, default: &[IpAddr]) -> Vec<IpAddr> {
        if self.address.is_empty() {
            default.to_vec()
        } else {
            self.address.iter().copied().map(canonical_ip).collect()
        }
    }

    /// The host page budgets on this host, or the configuration refused because it
    /// oversubscribes the host's limits (the daemon checks this at start).
    pub fn host_budget(
        &self,
        origin: &str,
        limits: &GrantLimits,
    ) -> Result<BudgetLimits, ConfigError> {
        self.host
            .budget(limits)
            .map_err(|what| ConfigError::Invalid {
                path: origin.to_owned(),
                what,
            })
    }

    /// The software device's connection manager: the backend's addresses `addrs` (see
    /// [`Config::addresses`]), `[cm]`'s timeout and CRC policy, and `policy`'s allowed peers
    /// as the filter of connects and incoming requests.
    pub fn cm_device_config(
        &self,
        addrs: Vec<IpAddr>,
        policy: std::sync::Arc<crate::control::policy::CmPolicy>,
    ) -> crate::device::CmConfig {
        crate::device::CmConfig {
            addrs,
            crc: self.cm.crc.into(),
            connect_timeout: self.cm.connect_timeout(),
            peer_probe: self.cm.peer_probe(),
            peer_filter: Some(std::sync::Arc::new(move |dom, peer| {
                policy.peer_allowed(u32::from(dom.0), peer.ip())
            })),
            ..crate::device::CmConfig::default()
        }
    }

    /// The device the configuration names.
    pub fn device_choice(&self) -> Result<DeviceChoice, String> {
        self.device.parse()
    }

    /// The software device's engine settings.
    pub fn engine(&self) -> EngineConfig {
        EngineConfig {
            threads: self.engine_threads,
            spin: Duration::from_micros(self.spin_before_sleep_us),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_is_the_defaults() {
        assert_eq!(Config::parse("", "t").unwrap(), Config::default());
    }

    #[test]
    fn documented_example_parses() {
        let text = r#"
            log-level = "debug"
            engine-threads = 4
            spin-before-sleep-us = 50
            [quotas]
            max-qps = 8
        "#;
        let c = Config::parse(text, "t").unwrap();
        assert_eq!(c.log_level, "debug");
        assert_eq!(c.engine().threads, 4);
        assert_eq!(c.engine().spin, Duration::from_micros(50));
        assert_eq!(c.quotas.max_qps, 8);
        assert_eq!(c.quotas.max_cqs, Quotas::default().max_cqs);
    }

    #[test]
    fn host_budgets_refuse_oversubscription_naming_both_knobs() {
        use xen_platform::xen::limits::HostLimit;
        let limits = GrantLimits {
            grant_pages: Some(HostLimit {
                value: 1000,
                knob: "gntalloc's limit (/sys/module/xen_gntalloc/parameters/limit)".into(),
            }),
        };
        let c = Config::parse("[host]\ngranted-pages = 1001\n", "f.toml").unwrap();
        let e = c.host_budget("f.toml", &limits).unwrap_err().to_string();
        assert!(
            e.contains("[host] granted-pages = 1001")
                && e.contains("xen_gntalloc/parameters/limit"),
            "{e}"
        );
        // the default is the host's limit, split among the guests
        let b = Config::default().host_budget("t", &limits).unwrap();
        assert_eq!((b.granted_pages, b.guests), (1000, 8));
        assert_eq!(b.share(crate::resources::budget::Pool::Granted), 125);
        let e = Config::parse("[host]\nmapped-pages = 300000\n", "f.toml").unwrap_err();
        assert!(e.to_string().contains("maptrack-entries"), "{e}");
        let e = Config::parse("[host]\nguests = 0\n", "f.toml").unwrap_err();
        assert!(e.to_string().contains("[host] guests"), "{e}");
    }

    #[test]
    fn mistakes_are_named() {
        let e = Config::parse("engine-thread = 2", "f.toml").unwrap_err();
        assert!(e.to_string().contains("engine-thread"), "{e}");
        let e = Config::parse("engine-threads = 0", "f.toml").unwrap_err();
        assert!(e.to_string().contains("engine-threads"), "{e}");
    }

    #[test]
    fn cm_rules_default_and_per_domain_override() {
        let text = r#"
            address = ["127.0.0.2", "::ffff:127.0.0.3"]
            [cm]
            max-listeners = 4
            crc = "decline"
            allowed-ports = [4791, "5000-5009"]
            allowed-peers = ["127.0.0.0/8", "fd00::/8"]
            [cm.domain.7]
            max-connects = 1
            allowed-ports = ["6000-6001"]
            allowed-peers = ["127.0.0.3"]
        "#;
        let c = Config::parse(text, "t").unwrap();
        assert_eq!(
            c.addresses(&[]),
            vec![
                "127.0.0.2".parse::<IpAddr>().unwrap(),
                "127.0.0.3".parse().unwrap()
            ]
        );
        let d = c.cm.rules(3);
        assert_eq!((d.max_listeners, d.max_connects), (4, 16));
        assert!(d.port_allowed(4791) && d.port_allowed(5009));
        assert!(!d.port_allowed(5010) && !d.port_allowed(6000));
        assert!(d.peer_allowed("127.9.9.9".parse().unwrap()));
        assert!(d.peer_allowed("::ffff:127.0.0.1".parse().unwrap()));
        assert!(d.peer_allowed("fd12::1".parse().unwrap()));
        assert!(!d.peer_allowed("10.0.0.1".parse().unwrap()));
        assert!(!d.peer_allowed("fe80::1".parse().unwrap()));
        let seven = c.cm.rules(7);
        assert_eq!((seven.max_listeners, seven.max_connects), (4, 1));
        assert!(seven.port_allowed(6001) && !seven.port_allowed(4791));
        assert!(seven.peer_allowed("127.0.0.3".parse().unwrap()));
        assert!(!seven.peer_allowed("127.0.0.2".parse().unwrap()));
        assert_eq!(c.cm.crc, MpaCrc::Decline);
        // The device's peer filter is the policy's.
        let policy = std::sync::Arc::new(crate::control::policy::CmPolicy::new(c.cm.clone()));
        let dev = c.cm_device_config(c.addresses(&[]), policy);
        assert_eq!(dev.crc, crate::device::CrcPolicy::Decline);
        let dom = |d: u16| xen_platform::DomId(d);
        assert!(dev.allows(dom(3), "127.0.0.9:1".parse().unwrap()));
        assert!(!dev.allows(dom(3), "10.0.0.1:1".parse().unwrap()));
        assert!(!dev.allows(dom(7), "127.0.0.2:1".parse().unwrap()));
        assert!(dev.allows(dom(7), "[::ffff:127.0.0.3]:1".parse().unwrap()));
        // Without a list: any peer, ports from 1024 up.
        let open = Config::default().cm.rules(1);
        assert!(open.port_allowed(1024) && !open.port_allowed(1023));
        assert!(open.peer_allowed("192.0.2.1".parse().unwrap()));
        // The file round-trips through its own serialisation.
        let again = Config::parse(&toml::to_string(&c).unwrap(), "t2").unwrap();
        assert_eq!(again, c);
    }

    /// `[cm] peer-probe-s`: the data path's 10 s unless set, carried to the device's
    /// connection manager; values TCP cannot take are refused with the key and the range.
    #[test]
    fn cm_peer_probe_is_configurable_and_checked() {
        let policy =
            |c: &Config| std::sync::Arc::new(crate::control::policy::CmPolicy::new(c.cm.clone()));
        let d = Config::default();
        let dev = d.cm_device_config(vec![], policy(&d));
        assert_eq!(dev.peer_probe, Duration::from_secs(DEFAULT_PEER_PROBE_S));
        assert_eq!(
            dev.peer_probe,
            crate::device::CmConfig::default().peer_probe
        );
        let c = Config::parse("[cm]\npeer-probe-s = 30\n", "t").unwrap();
        assert_eq!(c.cm.peer_probe_s, 30);
        let dev = c.cm_device_config(vec![], policy(&c));
        assert_eq!(dev.peer_probe, Duration::from_secs(30));
        for edge in [MIN_PEER_PROBE_S, MAX_PEER_PROBE_S] {
            let text = format!("[cm]\npeer-probe-s = {edge}\n");
            assert_eq!(Config::parse(&text, "t").unwrap().cm.peer_probe_s, edge);
        }
        for bad in ["0", "3", "3601", "100000"] {
            let text = format!("[cm]\npeer-probe-s = {bad}\n");
            let e = Config::parse(&text, "f.toml").unwrap_err().to_string();
            assert!(
                e.contains("f.toml")
                    && e.contains("peer-probe-s must be between 4 and 3600")
                    && e.contains(&format!("not {bad}")),
                "{bad}: {e}"
            );
        }
        for (text, needle) in [
            ("[cm]\npeer-probe-s = -1\n", "peer-probe-s"),
            ("[cm]\npeer-probe-s = \"10s\"\n", "peer-probe-s"),
            ("[cm.domain.7]\npeer-probe-s = 30\n", "peer-probe-s"),
        ] {
            let e = Config::parse(text, "f.toml").unwrap_err().to_string();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }

    #[test]
    fn cm_mistakes_are_named() {
        for (text, needle) in [
            ("[cm]\nallowed-ports = [\"5000-4000\"]", "5000-4000"),
            ("[cm]\nallowed-ports = [0]", "port 0"),
            ("[cm]\nallowed-ports = [\"http\"]", "http"),
            ("[cm]\nallowed-peers = [\"10.0.0.0/33\"]", "prefix 33"),
            ("[cm]\nallowed-peers = [\"example.org\"]", "example.org"),
            ("[cm.domain.dom7]\nmax-listeners = 1", "dom7"),
            ("[cm]\nconnect-timeout-ms = 0", "connect-timeout-ms"),
            ("address = [\"0.0.0.0\"]", "address"),
            ("[cm]\nmax-listener = 1", "max-listener"),
            ("[cm]\ncrc = \"maybe\"", "maybe"),
        ] {
            let e = Config::parse(text, "f.toml").unwrap_err().to_string();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }

    #[test]
    fn device_choices_parse_and_bad_ones_are_refused() {
        assert_eq!(Config::default().device_choice(), Ok(DeviceChoice::Soft));
        let c = Config::parse("device = \"verbs:rxe0\"", "f.toml").unwrap();
        assert_eq!(
            c.device_choice(),
            Ok(DeviceChoice::Verbs {
                ibdev: "rxe0".into(),
                port: 1
            })
        );
        assert_eq!(
            "verbs:mlx5_0:2".parse::<DeviceChoice>(),
            Ok(DeviceChoice::Verbs {
                ibdev: "mlx5_0".into(),
                port: 2
            })
        );
        for bad in [
            "verbs",
            "verbs:",
            "verbs:rxe0:0",
            "verbs:rxe0:x",
            "hca",
            "verbs:a/b",
        ] {
            assert!(bad.parse::<DeviceChoice>().is_err(), "{bad}");
        }
        let e = Config::parse("device = \"verbs:rxe0:999\"", "f.toml").unwrap_err();
        assert!(e.to_string().contains("verbs:rxe0:999"), "{e}");
    }
}
