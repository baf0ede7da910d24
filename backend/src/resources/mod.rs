//! Per-domain resource accounting: quotas (toolstack-owned, read from the backend device node),
//! the usage counters published under `stats/`, the per-channel tables of what a channel
//! holds ([`table`]), and the host-wide page budgets split among domains ([`budget`]).
//!
//! A quota bounds what one guest device (`D/<devid>`) may make the backend spend; the guest can
//! read but not write the nodes they come from. Charging is all-or-nothing and refunded by the
//! owner of the resource when it goes, so after a reclaim every counter is back to zero.

pub mod budget;
pub mod table;

use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

/// A resource a guest device can make the backend spend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Resource {
    Channels,
    Pds,
    Mrs,
    /// Guest pages mapped for memory regions.
    MrPages,
    Cqs,
    Qps,
    /// Pages the backend allocates and grants to the guest: doorbell and event-ring pages,
    /// queue and CQ rings, page-directory pages.
    GrantedPages,
}

impl Resource {
    /// Every resource, in the order of [`Usage`].
    pub const ALL: [Resource; 7] = [
        Resource::Channels,
        Resource::Pds,
        Resource::Mrs,
        Resource::MrPages,
        Resource::Cqs,
        Resource::Qps,
        Resource::GrantedPages,
    ];

    /// The quota's XenStore key in the backend device node (`max-qps`, ...).
    pub fn quota_key(self) -> &'static str {
        match self {
            Resource::Channels => "max-channels",
            Resource::Pds => "max-pds",
            Resource::Mrs => "max-mrs",
            Resource::MrPages => "max-mr-pages",
            Resource::Cqs => "max-cqs",
            Resource::Qps => "max-qps",
            Resource::GrantedPages => "max-granted-pages",
        }
    }

    /// The usage counter's key under the device node's `stats/` (`qps`, ...).
    pub fn stats_key(self) -> &'static str {
        &self.quota_key()["max-".len()..]
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for Resource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.quota_key())
    }
}

/// Per-device quotas. Missing keys in the backend node fall back to the daemon's defaults
/// (config file `[quotas]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct Quotas {
    pub max_channels: u32,
    pub max_pds: u32,
    pub max_mrs: u32,
    /// Guest pages registered in all MRs together (4 KiB each); also bounds one MR.
    pub max_mr_pages: u32,
    pub max_cqs: u32,
    pub max_qps: u32,
    /// Pages the backend grants to the device's guest (doorbells, event rings, queue and CQ
    /// rings, page directories), all channels together.
    pub max_granted_pages: u32,
}

impl Default for Quotas {
    fn default() -> Self {
        Quotas {
            max_channels: 16,
            max_pds: 64,
            max_mrs: 1024,
            max_mr_pages: 262_144,
            max_cqs: 256,
            max_qps: 256,
            max_granted_pages: 4096,
        }
    }
}

impl Quotas {
    /// The limit for `r`.
    pub fn get(&self, r: Resource) -> u32 {
        match r {
            Resource::Channels => self.max_channels,
            Resource::Pds => self.max_pds,
            Resource::Mrs => self.max_mrs,
            Resource::MrPages => self.max_mr_pages,
            Resource::Cqs => self.max_cqs,
            Resource::Qps => self.max_qps,
            Resource::GrantedPages => self.max_granted_pages,
        }
    }

    /// Sets the limit for `r`.
    pub fn set(&mut self, r: Resource, v: u32) {
        match r {
            Resource::Channels => self.max_channels = v,
            Resource::Pds => self.max_pds = v,
            Resource::Mrs => self.max_mrs = v,
            Resource::MrPages => self.max_mr_pages = v,
            Resource::Cqs => self.max_cqs = v,
            Resource::Qps => self.max_qps = v,
            Resource::GrantedPages => self.max_granted_pages = v,
        }
    }

    /// `(key, value)` pairs as the toolstack writes them.
    pub fn to_nodes(&self) -> Vec<(&'static str, String)> {
        Resource::ALL
            .iter()
            .map(|&r| (r.quota_key(), self.get(r).to_string()))
            .collect()
    }
}

/// A quota would be exceeded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "quota {quota} of domain {domid} device {devid} is {limit}: {used} in use, {asked} more asked"
)]
pub struct QuotaExceeded {
    pub quota: Resource,
    pub domid: u32,
    pub devid: u32,
    pub limit: u32,
    pub used: u64,
    pub asked: u64,
}

/// What a device uses now, per [`Resource`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage(pub [u64; 7]);

impl Usage {
    /// Units of `r` in use.
    pub fn get(&self, r: Resource) -> u64 {
        self.0[r.index()]
    }

    /// True when nothing is held.
    pub fn is_zero(&self) -> bool {
        self.0.iter().all(|&v| v == 0)
    }
}

/// The resource account of one guest device: its quotas and what its channels hold. Shared by
/// the xenbus side (channels) and every channel's control service.
pub struct Account {
    domid: u32,
    devid: u32,
    state: Mutex<AccountState>,
    on_change: Box<dyn Fn() + Send + Sync>,
}

struct AccountState {
    quotas: Quotas,
    used: Usage,
}

impl std::fmt::Debug for Account {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.lock();
        f.debug_struct("Account")
            .field("domid", &self.domid)
            .field("devid", &self.devid)
            .field("quotas", &st.quotas)
            .field("used", &st.used)
            .finish()
    }
}

impl Account {
    /// An empty account; `on_change` runs (outside the lock) after every charge and refund,
    /// e.g. to have the stats republished.
    pub fn new(
        domid: u32,
        devid: u32,
        quotas: Quotas,
        on_change: Box<dyn Fn() + Send + Sync>,
    ) -> Arc<Account> {
        Arc::new(Account {
            domid,
            devid,
            state: Mutex::new(AccountState {
                quotas,
                used: Usage::default(),
            }),
            on_change,
        })
    }

    fn lock(&self) -> MutexGuard<'_, AccountState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The guest domain.
    pub fn domid(&self) -> u32 {
        self.domid
    }

    /// The device id.
    pub fn devid(&self) -> u32 {
        self.devid
    }

    /// The quotas in force.
    pub fn quotas(&self) -> Quotas {
        self.lock().quotas
    }

    /// Replaces the quotas (the toolstack changed them); what is held stays held.
    pub fn set_quotas(&self, quotas: Quotas) {
        self.lock().quotas = quotas;
    }

    /// What is held now.
    pub fn usage(&self) -> Usage {
        self.lock().used
    }

    /// Takes `n` units of `r`, or refuses with the quota named (and logged).
    pub fn charge(&self, r: Resource, n: u64) -> Result<(), QuotaExceeded> {
        {
            let mut st = self.lock();
            let limit = st.quotas.get(r);
            let used = st.used.get(r);
            if used.saturating_add(n) > u64::from(limit) {
                let e = QuotaExceeded {
                    quota: r,
                    domid: self.domid,
                    devid: self.devid,
                    limit,
                    used,
                    asked: n,
                };
                tracing::warn!(domid = self.domid, devid = self.devid, quota = %r, "{e}");
                return Err(e);
            }
            st.used.0[r.index()] = used + n;
        }
        (self.on_change)();
        Ok(())
    }

    /// Gives back `n` units of `r` (never below zero).
    pub fn refund(&self, r: Resource, n: u64) {
        if n == 0 {
            return;
        }
        {
            let mut st = self.lock();
            let v = &mut st.used.0[r.index()];
            if *v < n {
                tracing::error!(
                    domid = self.domid,
                    devid = self.devid,
                    resource = %r,
                    "refund of {n} exceeds the {} held; accounting bug",
                    *v
                );
            }
            *v = v.saturating_sub(n);
        }
        (self.on_change)();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn keys_match_the_contract() {
        let keys: Vec<_> = Resource::ALL.iter().map(|r| r.quota_key()).collect();
        assert_eq!(
            keys,
            [
                "max-channels",
                "max-pds",
                "max-mrs",
                "max-mr-pages",
                "max-cqs",
                "max-qps",
                "max-granted-pages"
            ]
        );
        assert_eq!(Resource::MrPages.stats_key(), "mr-pages");
    }

    #[test]
    fn charge_refuses_past_the_quota_and_refund_returns_to_zero() {
        let changes = Arc::new(AtomicU32::new(0));
        let c = changes.clone();
        let q = Quotas {
            max_qps: 2,
            ..Quotas::default()
        };
        let a = Account::new(
            3,
            0,
            q,
            Box::new(move || {
                c.fetch_add(1, Ordering::Relaxed);
            }),
        );
        a.charge(Resource::Qps, 1).unwrap();
        a.charge(Resource::Qps, 1).unwrap();
        let e = a.charge(Resource::Qps, 1).unwrap_err();
        assert_eq!(e.quota, Resource::Qps);
        assert!(e.to_string().contains("max-qps"), "{e}");
        assert_eq!(a.usage().get(Resource::Qps), 2);
        a.refund(Resource::Qps, 2);
        assert!(a.usage().is_zero());
        assert_eq!(changes.load(Ordering::Relaxed), 3);
        // a huge request cannot wrap the counter
        let e = a.charge(Resource::MrPages, u64::MAX).unwrap_err();
        assert_eq!((e.quota, e.used, e.asked), (Resource::MrPages, 0, u64::MAX));
        assert!(a.usage().is_zero());
    }

    #[test]
    fn quotas_parse_from_toml_with_defaults() {
        let q: Quotas = toml::from_str("max-qps = 4\nmax-mr-pages = 10\n").unwrap();
        assert_eq!(q.max_qps, 4);
        assert_eq!(q.max_mr_pages, 10);
        assert_eq!(q.max_cqs, Quotas::default().max_cqs);
        let e = toml::from_str::<Quotas>("max-bananas = 1").unwrap_err();
        assert!(e.to_string().contains("unknown field `max-bananas`"), "{e}");
    }
}
