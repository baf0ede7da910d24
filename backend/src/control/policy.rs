//! Connection-management policy of the daemon, device-independent: the per-domain quotas on
//! listeners and connects in flight, and the allowed ports and peers of `[cm]`
//! (docs/operations.md). Checked by the control service before the device is asked; the
//! device applies [`CmPolicy::peer_allowed`] to incoming connections (its peer filter).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;

use crate::config::{CmRules, CmSettings};

/// What the connection-manager quotas count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmResource {
    Listeners,
    /// Connects issued and not yet established or failed.
    Connects,
}

/// What a domain holds now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CmUsage {
    pub listeners: u32,
    pub connects: u32,
}

impl CmUsage {
    fn slot(&mut self, r: CmResource) -> &mut u32 {
        match r {
            CmResource::Listeners => &mut self.listeners,
            CmResource::Connects => &mut self.connects,
        }
    }
}

/// The policy and the per-domain counters, shared by every channel of the daemon.
#[derive(Debug, Default)]
pub struct CmPolicy {
    settings: CmSettings,
    usage: Mutex<HashMap<u32, CmUsage>>,
}

impl CmPolicy {
    pub fn new(settings: CmSettings) -> CmPolicy {
        CmPolicy {
            settings,
            usage: Mutex::new(HashMap::new()),
        }
    }

    /// The settings the policy applies.
    pub fn settings(&self) -> &CmSettings {
        &self.settings
    }

    /// The rules of domain `domid`.
    pub fn rules(&self, domid: u32) -> CmRules {
        self.settings.rules(domid)
    }

    /// Whether domain `domid` may talk to `peer` (connect to it, or accept from it).
    pub fn peer_allowed(&self, domid: u32, peer: IpAddr) -> bool {
        self.rules(domid).peer_allowed(peer)
    }

    /// What domain `domid` holds.
    pub fn usage(&self, domid: u32) -> CmUsage {
        self.lock().get(&domid).copied().unwrap_or_default()
    }

    /// Counts one more `r` for `domid`, or says which quota it would exceed.
    pub fn charge(&self, domid: u32, r: CmResource) -> Result<(), String> {
        let rules = self.rules(domid);
        let (limit, key) = match r {
            CmResource::Listeners => (rules.max_listeners, "max-listeners"),
            CmResource::Connects => (rules.max_connects, "max-connects"),
        };
        let mut usage = self.lock();
        let used = usage.entry(domid).or_default().slot(r);
        if *used >= limit {
            return Err(format!(
                "[cm] {key} of domain {domid} is {limit}: {} in use",
                *used
            ));
        }
        *used += 1;
        Ok(())
    }

    /// Gives back `n` of `r` for `domid`.
    pub fn refund(&self, domid: u32, r: CmResource, n: u32) {
        if n == 0 {
            return;
        }
        let mut usage = self.lock();
        if let Some(u) = usage.get_mut(&domid) {
            let v = u.slot(r);
            *v = v.saturating_sub(n);
            if *u == CmUsage::default() {
                usage.remove(&domid);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, CmUsage>> {
        self.usage.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotas_are_per_domain_and_refunds_free_them() {
        let p = CmPolicy::new(
            crate::config::Config::parse(
                "[cm]\nmax-listeners = 2\n[cm.domain.5]\nmax-listeners = 1",
                "t",
            )
            .unwrap()
            .cm,
        );
        p.charge(4, CmResource::Listeners).unwrap();
        p.charge(4, CmResource::Listeners).unwrap();
        let e = p.charge(4, CmResource::Listeners).unwrap_err();
        assert!(e.contains("max-listeners of domain 4 is 2"), "{e}");
        p.charge(5, CmResource::Listeners).unwrap();
        assert!(p.charge(5, CmResource::Listeners).is_err());
        p.refund(4, CmResource::Listeners, 1);
        p.charge(4, CmResource::Listeners).unwrap();
        assert_eq!(p.usage(4).listeners, 2);
        p.refund(4, CmResource::Listeners, 5);
        assert_eq!(p.usage(4), CmUsage::default());
    }
}
