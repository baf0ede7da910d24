//! The host-wide page budgets, split fairly among guest domains.
//!
//! dom0 spends two different host resources on a guest's behalf, and each is finite for the
//! whole host:
//!
//! - **granted pages** — pages the backend allocates and grants to a guest (doorbell, event
//!   ring, queue and CQ rings, page-directory pages): gntalloc's host-wide `limit` on real Xen,
//!   dom0's grant limit on the simulated host;
//! - **mapped pages** — guest pages the backend maps (memory regions): dom0's maptrack on real
//!   Xen, shared with blkback and netback.
//!
//! "Fairly" means a static split: with `[host] guests = N`, one domain may hold at most
//! `budget / N` pages of each pool (all its devices and channels together), and all domains
//! together at most `budget`. So N domains can each use their whole share whatever the others
//! do; a domain beyond the N-th is served from what the others left.

use std::collections::BTreeMap;
use std::sync::Mutex;

/// A host-wide page pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Pool {
    /// Pages the backend grants to guests (gntalloc).
    Granted,
    /// Guest pages the backend maps (gntdev / maptrack).
    Mapped,
}

impl Pool {
    /// The configuration key of the pool's host budget.
    pub fn knob(self) -> &'static str {
        match self {
            Pool::Granted => "[host] granted-pages",
            Pool::Mapped => "[host] mapped-pages",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Pool::Granted => "pages granted by the backend",
            Pool::Mapped => "guest pages mapped by the backend",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The host budgets and how many guest domains they are split among.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetLimits {
    pub granted_pages: u64,
    pub mapped_pages: u64,
    /// Guest domains the budgets are split among (at least 1).
    pub guests: u32,
}

impl BudgetLimits {
    /// No host-wide bound (tests of other things, embedders that account elsewhere).
    pub const UNLIMITED: BudgetLimits = BudgetLimits {
        granted_pages: u64::MAX,
        mapped_pages: u64::MAX,
        guests: 1,
    };

    /// The pool's host budget.
    pub fn budget(&self, pool: Pool) -> u64 {
        match pool {
            Pool::Granted => self.granted_pages,
            Pool::Mapped => self.mapped_pages,
        }
    }

    /// What one domain may hold of the pool.
    pub fn share(&self, pool: Pool) -> u64 {
        self.budget(pool) / u64::from(self.guests.max(1))
    }
}

/// A page budget would be exceeded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetExceeded {
    /// The domain's fair share is used up.
    #[error(
        "domain {domid} holds {used} of its share of {share} {} ({} = {budget} split among \
         [host] guests = {guests}); {asked} more asked",
        .pool.what(), .pool.knob()
    )]
    Share {
        pool: Pool,
        domid: u32,
        share: u64,
        budget: u64,
        guests: u32,
        used: u64,
        asked: u64,
    },
    /// The host budget is used up (more domains than `[host] guests` are active).
    #[error(
        "the host budget of {budget} {} ({}) is used up: {used} held by all guests, {asked} \
         more asked by domain {domid} (more domains than [host] guests are active)",
        .pool.what(), .pool.knob()
    )]
    Host {
        pool: Pool,
        domid: u32,
        budget: u64,
        used: u64,
        asked: u64,
    },
}

/// What the host's guests hold of each pool, against the budgets.
#[derive(Debug)]
pub struct HostBudget {
    limits: BudgetLimits,
    state: Mutex<BudgetState>,
}

#[derive(Debug, Default)]
struct BudgetState {
    total: [u64; 2],
    domains: BTreeMap<u32, [u64; 2]>,
}

impl HostBudget {
    pub fn new(limits: BudgetLimits) -> HostBudget {
        HostBudget {
            limits,
            state: Mutex::new(BudgetState::default()),
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> BudgetLimits {
        self.limits
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BudgetState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Pages of `pool` domain `domid` holds.
    pub fn used_by(&self, domid: u32, pool: Pool) -> u64 {
        self.lock()
            .domains
            .get(&domid)
            .map_or(0, |d| d[pool.index()])
    }

    /// Pages of `pool` all domains hold.
    pub fn used(&self, pool: Pool) -> u64 {
        self.lock().total[pool.index()]
    }

    /// Takes `n` pages of `pool` for `domid`, or refuses naming the knob (all or nothing).
    pub fn charge(&self, domid: u32, pool: Pool, n: u64) -> Result<(), BudgetExceeded> {
        let i = pool.index();
        let mut st = self.lock();
        let used = st.domains.get(&domid).map_or(0, |d| d[i]);
        let share = self.limits.share(pool);
        if used.saturating_add(n) > share {
            return Err(BudgetExceeded::Share {
                pool,
                domid,
                share,
                budget: self.limits.budget(pool),
                guests: self.limits.guests,
                used,
                asked: n,
            });
        }
        let total = st.total[i];
        if total.saturating_add(n) > self.limits.budget(pool) {
            return Err(BudgetExceeded::Host {
                pool,
                domid,
                budget: self.limits.budget(pool),
                used: total,
                asked: n,
            });
        }
        st.total[i] = total + n;
        st.domains.entry(domid).or_default()[i] = used + n;
        Ok(())
    }

    /// Gives back `n` pages of `pool` held by `domid` (never below zero).
    pub fn refund(&self, domid: u32, pool: Pool, n: u64) {
        if n == 0 {
            return;
        }
        let i = pool.index();
        let mut st = self.lock();
        let Some(d) = st.domains.get_mut(&domid) else {
            tracing::error!(
                domid,
                "refund of {n} {} not held; accounting bug",
                pool.what()
            );
            return;
        };
        if d[i] < n {
            tracing::error!(
                domid,
                "refund of {n} {} exceeds the {} held; accounting bug",
                pool.what(),
                d[i]
            );
        }
        let given = n.min(d[i]);
        d[i] -= given;
        if d.iter().all(|&v| v == 0) {
            st.domains.remove(&domid);
        }
        st.total[i] = st.total[i].saturating_sub(given);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> BudgetLimits {
        BudgetLimits {
            granted_pages: 100,
            mapped_pages: 1000,
            guests: 4,
        }
    }

    #[test]
    fn a_domain_gets_its_share_and_no_more() {
        let b = HostBudget::new(limits());
        b.charge(1, Pool::Granted, 25).unwrap();
        let e = b.charge(1, Pool::Granted, 1).unwrap_err();
        assert!(
            matches!(e, BudgetExceeded::Share { share: 25, .. }),
            "{e:?}"
        );
        let s = e.to_string();
        assert!(
            s.contains("[host] granted-pages") && s.contains("[host] guests"),
            "{s}"
        );
        // another domain is untouched by the first one's exhaustion
        b.charge(2, Pool::Granted, 25).unwrap();
        b.charge(1, Pool::Mapped, 250).unwrap();
        assert_eq!(b.used(Pool::Granted), 50);
        b.refund(1, Pool::Granted, 25);
        b.refund(1, Pool::Mapped, 250);
        b.refund(2, Pool::Granted, 25);
        assert_eq!((b.used(Pool::Granted), b.used(Pool::Mapped)), (0, 0));
        assert_eq!(b.used_by(1, Pool::Granted), 0);
    }

    #[test]
    fn more_domains_than_guests_share_what_is_left() {
        let b = HostBudget::new(limits());
        for d in 1..=4 {
            b.charge(d, Pool::Granted, 25).unwrap();
        }
        let e = b.charge(5, Pool::Granted, 1).unwrap_err();
        assert!(matches!(e, BudgetExceeded::Host { used: 100, .. }), "{e:?}");
        assert!(e.to_string().contains("[host] granted-pages"), "{e}");
        // a huge request cannot wrap a counter
        let e = b.charge(6, Pool::Mapped, u64::MAX).unwrap_err();
        assert!(
            matches!(
                e,
                BudgetExceeded::Share {
                    pool: Pool::Mapped,
                    domid: 6,
                    used: 0,
                    asked: u64::MAX,
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(b.used_by(6, Pool::Mapped), 0);
    }

    #[test]
    fn unlimited_never_refuses() {
        let b = HostBudget::new(BudgetLimits::UNLIMITED);
        b.charge(1, Pool::Granted, 1 << 40).unwrap();
        b.charge(2, Pool::Granted, 1 << 40).unwrap();
    }
}
