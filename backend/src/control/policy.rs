//! Connection-management policy of the daemon, device-independent: the per-domain quotas on
//! listeners and connects in flight, and the allowed ports and peers of `[cm]`
//! (docs/operations.md). Checked by the control service before the device is asked; the
//! device applies [`CmPolicy::peer_allowed`] to incoming connections (its peer filter).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
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

    /// Whether domain `domid` may move a QP to RTR towards the port with GID `gid` (an
    /// address-vector connect): `Ok` with the address checked (`None`: no address, allowed
    /// because the domain has no allowed-peers list), else why not. See [`gid_peer`].
    pub fn av_peer_allowed(&self, domid: u32, gid: [u8; 16]) -> Result<Option<IpAddr>, String> {
        let rules = self.rules(domid);
        match gid_peer(gid) {
            Some(ip) if rules.peer_allowed(ip) => Ok(Some(ip)),
            Some(ip) => Err(format!(
                "domain {domid} may not connect to GID {} ({ip}: [cm] allowed-peers)",
                Ipv6Addr::from(gid)
            )),
            None if rules.allowed_peers.is_none() => Ok(None),
            None => Err(format!(
                "domain {domid} may not connect to a peer without a GID (a LID-only address \
                 vector names no address [cm] allowed-peers could allow)"
            )),
        }
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

/// The address `[cm] allowed-peers` checks for an address vector's GID. A GID is 16 bytes an
/// IPv6 address could be: RoCE v2 GIDs *are* the peer's addresses — an IPv4 peer's is the
/// IPv4-mapped `::ffff:a.b.c.d`, checked as that IPv4 address (as `Connect` checks a
/// v4-mapped address); any other GID (RoCE v2 IPv6, RoCE v1 and InfiniBand's `fe80::`
/// link-local or subnet-prefix + port GUID) is checked as the IPv6 address it spells, so an
/// allowed-peers list admits such a peer only by an IPv6 network that contains it. The
/// all-zero GID (InfiniBand without a global route: the peer is a LID) is no address.
pub fn gid_peer(gid: [u8; 16]) -> Option<IpAddr> {
    let v6 = Ipv6Addr::from(gid);
    if v6.is_unspecified() {
        return None;
    }
    Some(match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    })
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

    fn gid(s: &str) -> [u8; 16] {
        s.parse::<Ipv6Addr>().unwrap().octets()
    }

    #[test]
    fn an_address_vector_s_gid_is_checked_against_allowed_peers() {
        let p = CmPolicy::new(
            crate::config::Config::parse(
                "[cm]\nallowed-peers = [\"10.77.0.0/24\", \"fd00::/8\"]\n\
                 [cm.domain.6]\nallowed-peers = [\"10.77.0.1/32\"]",
                "t",
            )
            .unwrap()
            .cm,
        );
        // RoCE v2 GID of an IPv4 peer: the v4-mapped address, checked as IPv4.
        assert_eq!(
            p.av_peer_allowed(4, gid("::ffff:10.77.0.9")),
            Ok(Some("10.77.0.9".parse().unwrap()))
        );
        let e = p.av_peer_allowed(4, gid("::ffff:10.78.0.1")).unwrap_err();
        assert!(e.contains("may not connect to GID ::ffff:10.78.0.1"), "{e}");
        assert!(e.contains("allowed-peers"), "{e}");
        // Per-domain lists replace the global one.
        assert!(p.av_peer_allowed(6, gid("::ffff:10.77.0.9")).is_err());
        assert!(p.av_peer_allowed(6, gid("::ffff:10.77.0.1")).is_ok());
        // Other GIDs are the IPv6 addresses they spell: RoCE v2 IPv6, link-local.
        assert!(p.av_peer_allowed(4, gid("fd00::5")).is_ok());
        assert!(p.av_peer_allowed(4, gid("fe80::200:5eff:fe00:1")).is_err());
        // No GID (LID only): refused where a list exists, allowed where none does.
        let e = p.av_peer_allowed(4, [0; 16]).unwrap_err();
        assert!(e.contains("without a GID"), "{e}");
        let open = CmPolicy::default();
        assert_eq!(open.av_peer_allowed(4, [0; 16]), Ok(None));
        assert!(open.av_peer_allowed(4, gid("fe80::1")).is_ok());
    }
}
