//! Xen's shared ring (`xen/include/public/io/ring.h`), byte for byte.
//!
//! A ring is a shared region of one or more 4 KiB pages: a 64-byte header
//! (`req_prod, req_event, rsp_prod, rsp_event`, 4 private bytes, 44 pad bytes) followed by
//! `N`-byte entries, each holding a request or a response. The entry count is what fits, rounded
//! down to a power of two exactly as `__RING_SIZE` computes it. Indexes are free-running `u32`.
//!
//! The [`FrontRing`] produces requests and consumes responses; the [`BackRing`] consumes
//! requests and produces responses. Neither knows about grants or event channels: the caller
//! maps the pages and sends a notification when a `*_and_check_notify` call returns `true`.
//!
//! The back end is hardened against its front end: requests are copied out of shared memory
//! before they are looked at (`RING_COPY_REQUEST`), and a producer index that claims more
//! requests than the ring holds (`RING_REQUEST_PROD_OVERFLOW`) or that moved backwards is a
//! [`RingError::ProducerOverflow`] / [`RingError::ProducerBackwards`], never trusted.

use std::sync::atomic::Ordering;

use crate::mem::{full_fence, MemError, SharedRegion, SharedWord, SlotArray};

/// A free-running ring index (`RING_IDX`).
pub type RingIdx = u32;

/// Byte offsets of the shared ring header (`struct NAME_sring`).
pub mod header {
    /// `req_prod`: written by the front end (requests published up to here).
    pub const REQ_PROD: usize = 0;
    /// `req_event`: written by the back end (notify me when `req_prod` passes this).
    pub const REQ_EVENT: usize = 4;
    /// `rsp_prod`: written by the back end (responses published up to here).
    pub const RSP_PROD: usize = 8;
    /// `rsp_event`: written by the front end (notify me when `rsp_prod` passes this).
    pub const RSP_EVENT: usize = 12;
    /// `pvt`: 4 protocol-private bytes (netif's `smartpoll_active`), zeroed at init.
    pub const PVT: usize = 16;
    /// `__pad`: 44 bytes, zeroed at init.
    pub const PAD: usize = 20;
    /// Offset of entry 0 (`ring[0]`).
    pub const ENTRIES: usize = 64;
}

/// Length of the shared ring header; entries start here.
pub const RING_HEADER_LEN: usize = header::ENTRIES;

/// Errors of a ring end. Every error caused by the peer is a protocol error: the caller should
/// stop using the ring (close the channel), not retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    #[error("ring region of {region_len} bytes holds no {entry_len}-byte entry")]
    TooSmall { region_len: usize, entry_len: usize },
    #[error("ring is full ({size} entries outstanding)")]
    Full { size: u32 },
    #[error("no consumed request left to answer")]
    NoRequestOutstanding,
    #[error(
        "protocol error: peer's producer index {prod} claims more than the {size} entries the ring holds (consumer at {cons})"
    )]
    ProducerOverflow { prod: u32, cons: u32, size: u32 },
    #[error("protocol error: peer's producer index {prod} is behind our consumer index {cons}")]
    ProducerBackwards { prod: u32, cons: u32 },
    #[error(transparent)]
    Mem(#[from] MemError),
}

/// Number of `entry_len`-byte entries a `region_len`-byte ring holds: what fits after the
/// header, rounded down to a power of two (`__CONST_RING_SIZE` / `__RING_SIZE` with `__RD32`).
pub const fn ring_entries(region_len: usize, entry_len: usize) -> u32 {
    if entry_len == 0 || region_len < RING_HEADER_LEN {
        return 0;
    }
    let fit = (region_len - RING_HEADER_LEN) / entry_len;
    // __RD32 works on a 32-bit value.
    let fit = if fit > u32::MAX as usize {
        u32::MAX
    } else {
        fit as u32
    };
    if fit == 0 {
        0
    } else {
        1 << (31 - fit.leading_zeros())
    }
}

/// Size in bytes of a ring of `2^order` pages (`ring-page-order` as blkif/netif use it).
pub const fn ring_region_len(order: u32) -> usize {
    crate::mem::PAGE_SIZE << order
}

/// The parts of a ring both ends use: the four header words and the entries.
#[derive(Clone, Debug)]
struct Sring<const N: usize> {
    region: SharedRegion,
    req_prod: SharedWord,
    req_event: SharedWord,
    rsp_prod: SharedWord,
    rsp_event: SharedWord,
    entries: SlotArray<N>,
}

impl<const N: usize> Sring<N> {
    fn new(region: SharedRegion) -> Result<Self, RingError> {
        let size = ring_entries(region.len(), N);
        if size == 0 {
            return Err(RingError::TooSmall {
                region_len: region.len(),
                entry_len: N,
            });
        }
        Ok(Self {
            req_prod: region.word(header::REQ_PROD)?,
            req_event: region.word(header::REQ_EVENT)?,
            rsp_prod: region.word(header::RSP_PROD)?,
            rsp_event: region.word(header::RSP_EVENT)?,
            entries: region.slots::<N>(header::ENTRIES, size as usize)?,
            region,
        })
    }

    fn size(&self) -> u32 {
        self.entries.count()
    }
}

/// The front end of a Xen ring: produces requests, consumes responses.
#[derive(Debug)]
pub struct FrontRing<const N: usize> {
    sring: Sring<N>,
    req_prod_pvt: RingIdx,
    rsp_cons: RingIdx,
}

impl<const N: usize> FrontRing<N> {
    /// Initialises the shared header (`SHARED_RING_INIT`) and attaches at index 0
    /// (`FRONT_RING_INIT`): what `XEN_FRONT_RING_INIT` does. Only the front end initialises.
    pub fn init(region: SharedRegion) -> Result<Self, RingError> {
        let sring = Sring::<N>::new(region)?;
        sring.req_prod.store(0, Ordering::Relaxed);
        sring.rsp_prod.store(0, Ordering::Relaxed);
        sring.req_event.store(1, Ordering::Relaxed);
        sring.rsp_event.store(1, Ordering::Relaxed);
        sring
            .region
            .zero(header::PVT, RING_HEADER_LEN - header::PVT)?;
        Ok(Self {
            sring,
            req_prod_pvt: 0,
            rsp_cons: 0,
        })
    }

    /// Attaches to an already initialised ring with both private indexes at `idx`
    /// (`FRONT_RING_ATTACH`), e.g. after reconnecting.
    pub fn attach(region: SharedRegion, idx: RingIdx) -> Result<Self, RingError> {
        Ok(Self {
            sring: Sring::new(region)?,
            req_prod_pvt: idx,
            rsp_cons: idx,
        })
    }

    /// Number of entries (`RING_SIZE`).
    pub fn size(&self) -> u32 {
        self.sring.size()
    }
    /// Private request producer index (`req_prod_pvt`): next request slot to fill.
    pub fn req_prod_pvt(&self) -> RingIdx {
        self.req_prod_pvt
    }
    /// Private response consumer index (`rsp_cons`).
    pub fn rsp_cons(&self) -> RingIdx {
        self.rsp_cons
    }
    /// `RING_FREE_REQUESTS`.
    pub fn free_requests(&self) -> u32 {
        self.size()
            .wrapping_sub(self.req_prod_pvt.wrapping_sub(self.rsp_cons))
    }
    /// `RING_FULL`.
    pub fn is_full(&self) -> bool {
        self.free_requests() == 0
    }

    /// Writes a request into the next free slot (not yet visible to the back end: call a
    /// `push_requests*` method). Returns the request's ring index.
    pub fn write_request(&mut self, req: &[u8; N]) -> Result<RingIdx, RingError> {
        // A free slot is one whose response has been consumed (RING_FULL); beyond that the
        // C macros would silently overwrite live entries.
        if self.is_full() {
            return Err(RingError::Full { size: self.size() });
        }
        let idx = self.req_prod_pvt;
        self.sring.entries.write(idx, req);
        self.req_prod_pvt = idx.wrapping_add(1);
        Ok(idx)
    }

    /// Publishes written requests (`RING_PUSH_REQUESTS`) without checking for notification.
    pub fn push_requests(&mut self) {
        // Release = the xen_wmb(): entries are visible before the index.
        self.sring
            .req_prod
            .store(self.req_prod_pvt, Ordering::Release);
    }

    /// Publishes written requests and says whether the back end must be notified
    /// (`RING_PUSH_REQUESTS_AND_CHECK_NOTIFY`).
    pub fn push_requests_and_check_notify(&mut self) -> bool {
        let old = self.sring.req_prod.load(Ordering::Relaxed);
        let new = self.req_prod_pvt;
        self.sring.req_prod.store(new, Ordering::Release);
        // xen_mb(): the back end must see the new req_prod before we read req_event.
        full_fence();
        let event = self.sring.req_event.load(Ordering::Relaxed);
        new.wrapping_sub(event) < new.wrapping_sub(old)
    }

    /// Number of published responses not yet consumed (`RING_HAS_UNCONSUMED_RESPONSES`),
    /// after checking the back end's `rsp_prod` (`RING_RESPONSE_PROD_OVERFLOW`).
    pub fn unconsumed_responses(&self) -> Result<u32, RingError> {
        let prod = self.sring.rsp_prod.load(Ordering::Acquire);
        let n = prod.wrapping_sub(self.rsp_cons);
        if n > self.size() {
            return Err(RingError::ProducerOverflow {
                prod,
                cons: self.rsp_cons,
                size: self.size(),
            });
        }
        Ok(n)
    }

    /// Copies the next published response out of the ring (`RING_COPY_RESPONSE`) and consumes
    /// it; `None` when there is none.
    pub fn next_response(&mut self) -> Result<Option<[u8; N]>, RingError> {
        if self.unconsumed_responses()? == 0 {
            return Ok(None);
        }
        let rsp = self.sring.entries.read(self.rsp_cons);
        self.rsp_cons = self.rsp_cons.wrapping_add(1);
        Ok(Some(rsp))
    }

    /// `RING_FINAL_CHECK_FOR_RESPONSES`: `true` if responses are pending; otherwise asks to be
    /// notified on the next one (`rsp_event = rsp_cons + 1`) and checks again after a full
    /// fence, so a response published concurrently is never missed.
    pub fn final_check_for_responses(&mut self) -> Result<bool, RingError> {
        if self.unconsumed_responses()? != 0 {
            return Ok(true);
        }
        self.sring
            .rsp_event
            .store(self.rsp_cons.wrapping_add(1), Ordering::Relaxed);
        full_fence();
        Ok(self.unconsumed_responses()? != 0)
    }
}

/// The back end of a Xen ring: consumes requests, produces responses.
#[derive(Debug)]
pub struct BackRing<const N: usize> {
    sring: Sring<N>,
    rsp_prod_pvt: RingIdx,
    req_cons: RingIdx,
}

impl<const N: usize> BackRing<N> {
    /// Attaches to a ring the front end initialised, at index 0 (`BACK_RING_INIT`).
    pub fn new(region: SharedRegion) -> Result<Self, RingError> {
        Self::attach(region, 0)
    }

    /// Attaches with both private indexes at `idx` (`BACK_RING_ATTACH`).
    pub fn attach(region: SharedRegion, idx: RingIdx) -> Result<Self, RingError> {
        Ok(Self {
            sring: Sring::new(region)?,
            rsp_prod_pvt: idx,
            req_cons: idx,
        })
    }

    /// Number of entries (`RING_SIZE`).
    pub fn size(&self) -> u32 {
        self.sring.size()
    }
    /// Private request consumer index (`req_cons`).
    pub fn req_cons(&self) -> RingIdx {
        self.req_cons
    }
    /// Private response producer index (`rsp_prod_pvt`).
    pub fn rsp_prod_pvt(&self) -> RingIdx {
        self.rsp_prod_pvt
    }
    /// Requests consumed but not yet answered.
    pub fn outstanding(&self) -> u32 {
        self.req_cons.wrapping_sub(self.rsp_prod_pvt)
    }

    /// Number of requests that may be consumed now (`RING_HAS_UNCONSUMED_REQUESTS`), after
    /// checking the front end's `req_prod`: one claiming more than the ring holds
    /// (`RING_REQUEST_PROD_OVERFLOW`) or one behind `req_cons` is a protocol error.
    pub fn unconsumed_requests(&self) -> Result<u32, RingError> {
        let prod = self.sring.req_prod.load(Ordering::Acquire);
        let size = self.size();
        if prod.wrapping_sub(self.rsp_prod_pvt) > size {
            return Err(RingError::ProducerOverflow {
                prod,
                cons: self.req_cons,
                size,
            });
        }
        let req = prod.wrapping_sub(self.req_cons);
        if req > size {
            return Err(RingError::ProducerBackwards {
                prod,
                cons: self.req_cons,
            });
        }
        let rsp = size.wrapping_sub(self.req_cons.wrapping_sub(self.rsp_prod_pvt));
        Ok(req.min(rsp))
    }

    /// Copies the next request out of the ring (`RING_COPY_REQUEST`) and consumes it; `None`
    /// when there is none. The copy is private: validate it, not the shared slot.
    pub fn next_request(&mut self) -> Result<Option<[u8; N]>, RingError> {
        if self.unconsumed_requests()? == 0 {
            return Ok(None);
        }
        let req = self.sring.entries.read(self.req_cons);
        self.req_cons = self.req_cons.wrapping_add(1);
        Ok(Some(req))
    }

    /// Writes a response into the slot of the oldest unanswered request (not yet visible to the
    /// front end: call a `push_responses*` method). Returns the response's ring index.
    pub fn write_response(&mut self, rsp: &[u8; N]) -> Result<RingIdx, RingError> {
        if self.outstanding() == 0 {
            return Err(RingError::NoRequestOutstanding);
        }
        let idx = self.rsp_prod_pvt;
        self.sring.entries.write(idx, rsp);
        self.rsp_prod_pvt = idx.wrapping_add(1);
        Ok(idx)
    }

    /// Publishes written responses (`RING_PUSH_RESPONSES`) without checking for notification.
    pub fn push_responses(&mut self) {
        self.sring
            .rsp_prod
            .store(self.rsp_prod_pvt, Ordering::Release);
    }

    /// Publishes written responses and says whether the front end must be notified
    /// (`RING_PUSH_RESPONSES_AND_CHECK_NOTIFY`).
    pub fn push_responses_and_check_notify(&mut self) -> bool {
        let old = self.sring.rsp_prod.load(Ordering::Relaxed);
        let new = self.rsp_prod_pvt;
        self.sring.rsp_prod.store(new, Ordering::Release);
        // xen_mb(): the front end must see the new rsp_prod before we read rsp_event.
        full_fence();
        let event = self.sring.rsp_event.load(Ordering::Relaxed);
        new.wrapping_sub(event) < new.wrapping_sub(old)
    }

    /// `RING_FINAL_CHECK_FOR_REQUESTS`: `true` if requests are pending; otherwise asks to be
    /// notified on the next one (`req_event = req_cons + 1`) and checks again after a full
    /// fence.
    pub fn final_check_for_requests(&mut self) -> Result<bool, RingError> {
        if self.unconsumed_requests()? != 0 {
            return Ok(true);
        }
        self.sring
            .req_event
            .store(self.req_cons.wrapping_add(1), Ordering::Relaxed);
        full_fence();
        Ok(self.unconsumed_requests()? != 0)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn entry_count_matches_the_c_rounding() {
        // (4096 - 64) / 64 = 63 -> 32; / 12 = 336 -> 256; order 1: (8192-64)/12 = 677 -> 512
        assert_eq!(ring_entries(4096, 64), 32);
        assert_eq!(ring_entries(4096, 12), 256);
        assert_eq!(ring_entries(8192, 12), 512);
        assert_eq!(ring_entries(64 + 64, 64), 1);
        assert_eq!(ring_entries(64 + 63, 64), 0);
        assert_eq!(ring_entries(10, 4), 0);
        for n in 1..5000usize {
            let fit = ((4096 - 64) / n) as u32;
            let e = ring_entries(4096, n);
            if fit == 0 {
                assert_eq!(e, 0);
            } else {
                assert!(e.is_power_of_two() && e <= fit && e * 2 > fit, "n={n}");
            }
        }
    }

    #[test]
    fn request_response_round_trip_and_init_header() {
        let region = SharedRegion::alloc(4096).unwrap();
        region.write(0, &[0xffu8; 64]).unwrap();
        let mut f = FrontRing::<64>::init(region.clone()).unwrap();
        let mut hdr = [0u8; 64];
        region.read(0, &mut hdr).unwrap();
        let mut want = [0u8; 64];
        want[4] = 1;
        want[12] = 1;
        assert_eq!(hdr, want);
        let mut b = BackRing::<64>::new(region.clone()).unwrap();
        assert_eq!(f.size(), 32);
        assert_eq!(b.next_request().unwrap(), None);
        f.write_request(&[7; 64]).unwrap();
        assert!(f.push_requests_and_check_notify());
        assert_eq!(b.next_request().unwrap(), Some([7; 64]));
        assert!(matches!(b.write_response(&[8; 64]), Ok(0)));
        assert!(matches!(
            b.write_response(&[9; 64]),
            Err(RingError::NoRequestOutstanding)
        ));
        assert!(b.push_responses_and_check_notify());
        assert_eq!(f.next_response().unwrap(), Some([8; 64]));
        assert!(!f.final_check_for_responses().unwrap());
    }

    #[test]
    fn front_refuses_to_overfill() {
        let region = SharedRegion::alloc(64 + 4 * 16).unwrap();
        let mut f = FrontRing::<16>::init(region).unwrap();
        for i in 0..4 {
            assert_eq!(f.write_request(&[i; 16]).unwrap(), i as u32);
        }
        assert_eq!(f.write_request(&[9; 16]), Err(RingError::Full { size: 4 }));
    }
}
