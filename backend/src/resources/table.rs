//! What one channel holds: its PDs, MRs, CQs and QPs with the references between them, and
//! the doorbell slots it handed out. The device checks handles too; this table lets the
//! control service refuse foreign handles and in-use objects before calling the device, and
//! tells the reclaim path what to give back to the [`super::Account`].

use std::collections::{BTreeMap, BTreeSet};

use crate::device::{CqId, MrHandle, PdId, QpNum};

/// A registered memory region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MrEntry {
    pub pd: PdId,
    /// Guest pages mapped for it (charged to `max-mr-pages`).
    pub pages: u64,
}

/// A completion queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqEntry {
    pub doorbell_slot: u32,
    /// Pages granted for it (ring and directory pages).
    pub granted_pages: u64,
}

/// A queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpEntry {
    pub pd: PdId,
    pub send_cq: CqId,
    pub recv_cq: CqId,
    pub sq_slot: u32,
    pub rq_slot: u32,
    /// Pages granted for it (SQ, RQ and directory pages).
    pub granted_pages: u64,
}

/// The objects of one channel.
#[derive(Debug, Default)]
pub struct ChannelTable {
    pub pds: BTreeSet<PdId>,
    pub mrs: BTreeMap<MrHandle, MrEntry>,
    pub cqs: BTreeMap<CqId, CqEntry>,
    pub qps: BTreeMap<QpNum, QpEntry>,
    slots: SlotAllocator,
}

impl ChannelTable {
    /// A table for a channel whose doorbell pages have `slots_per_page` slots each; it starts
    /// with one page.
    pub fn new(slots_per_page: u32) -> Self {
        ChannelTable {
            slots: SlotAllocator::new(slots_per_page),
            ..ChannelTable::default()
        }
    }

    /// Whether an MR or QP still uses the PD.
    pub fn pd_in_use(&self, pd: PdId) -> bool {
        self.mrs.values().any(|m| m.pd == pd) || self.qps.values().any(|q| q.pd == pd)
    }

    /// Whether a QP still uses the CQ.
    pub fn cq_in_use(&self, cq: CqId) -> bool {
        self.qps
            .values()
            .any(|q| q.send_cq == cq || q.recv_cq == cq)
    }

    /// Takes `n` free doorbell slots, all on one doorbell page (all or none).
    pub fn take_slots(&mut self, n: usize) -> Option<Vec<u32>> {
        self.slots.take(n)
    }

    /// Another doorbell page's slots become available.
    pub fn add_slot_page(&mut self) {
        self.slots.pages += 1;
    }

    /// Doorbell pages so far.
    pub fn slot_pages(&self) -> u32 {
        self.slots.pages
    }

    /// Slots per doorbell page.
    pub fn slots_per_page(&self) -> u32 {
        self.slots.per_page
    }

    /// Gives doorbell slots back.
    pub fn free_slots(&mut self, slots: &[u32]) {
        for &s in slots {
            self.slots.free(s);
        }
    }

    /// Doorbell slots of all pages.
    pub fn slot_count(&self) -> u32 {
        self.slots.per_page.saturating_mul(self.slots.pages)
    }
}

/// Lowest-free allocation of doorbell slots, numbered across pages (`per_page` each); the
/// slots of one request are on one page.
#[derive(Debug, Default)]
struct SlotAllocator {
    per_page: u32,
    pages: u32,
    used: BTreeSet<u32>,
}

impl SlotAllocator {
    fn new(per_page: u32) -> Self {
        SlotAllocator {
            per_page,
            pages: 1,
            used: BTreeSet::new(),
        }
    }

    fn take(&mut self, n: usize) -> Option<Vec<u32>> {
        for page in 0..self.pages {
            let first = page * self.per_page;
            let free: Vec<u32> = (first..first + self.per_page)
                .filter(|s| !self.used.contains(s))
                .take(n)
                .collect();
            if free.len() == n {
                self.used.extend(free.iter().copied());
                return Some(free);
            }
        }
        None
    }

    fn free(&mut self, s: u32) {
        self.used.remove(&s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_all_or_nothing_and_reused() {
        let mut t = ChannelTable::new(3);
        assert_eq!(t.take_slots(2), Some(vec![0, 1]));
        assert_eq!(t.take_slots(2), None);
        assert_eq!(t.take_slots(1), Some(vec![2]));
        t.free_slots(&[0]);
        assert_eq!(t.take_slots(1), Some(vec![0]));
    }

    #[test]
    fn slots_of_one_request_share_a_page_and_pages_extend_the_numbering() {
        let mut t = ChannelTable::new(3);
        assert_eq!(t.take_slots(2), Some(vec![0, 1]));
        assert_eq!(t.take_slots(2), None, "slot 2 is alone on page 0");
        t.add_slot_page();
        assert_eq!(t.slot_count(), 6);
        assert_eq!(t.take_slots(2), Some(vec![3, 4]));
        assert_eq!(t.take_slots(1), Some(vec![2]));
        assert_eq!(t.take_slots(1), Some(vec![5]));
        assert_eq!(t.take_slots(1), None);
    }

    #[test]
    fn references_keep_objects_busy() {
        let mut t = ChannelTable::new(8);
        t.pds.insert(PdId(1));
        t.cqs.insert(
            CqId(2),
            CqEntry {
                doorbell_slot: 0,
                granted_pages: 1,
            },
        );
        assert!(!t.pd_in_use(PdId(1)));
        t.qps.insert(
            QpNum(3),
            QpEntry {
                pd: PdId(1),
                send_cq: CqId(2),
                recv_cq: CqId(2),
                sq_slot: 1,
                rq_slot: 2,
                granted_pages: 2,
            },
        );
        assert!(t.pd_in_use(PdId(1)));
        assert!(t.cq_in_use(CqId(2)));
    }
}
