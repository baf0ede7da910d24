//! Two-domain ping-pong through a shared page and an event channel, on whatever platform the
//! process detects. Used by the tests (simulated host) and by `examples/platform-probe.rs`
//! (which the Xen lab points at real devices).
//!
//! The offering side shares one page and an unbound port and publishes `gref port` in a file;
//! the mapping side maps the page, binds the port, and they take turns incrementing a counter
//! at offset 0, each turn announced with an event.

#![allow(dead_code)]

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use xen_platform::{Access, DomId, EventChannel, EvtchnPort, GrantRef, Platform};

/// The counter at the start of a region.
///
/// # Safety
/// `ptr` must point to at least 4 bytes of shared memory, 4-byte aligned, mapped for as long as
/// the returned reference is used. An atomic is the right access for memory another party
/// writes concurrently.
unsafe fn counter<'a>(ptr: *mut u8) -> &'a AtomicU32 {
    // SAFETY: forwarded to the caller; AtomicU32 has the layout of u32.
    unsafe { &*(ptr as *const AtomicU32) }
}

fn wait_for(ch: &EventChannel, c: &AtomicU32, want: u32, deadline: Instant) -> Result<(), String> {
    while c.load(Ordering::Acquire) != want {
        if Instant::now() > deadline {
            return Err(format!(
                "counter stuck at {} waiting for {want}",
                c.load(Ordering::Acquire)
            ));
        }
        ch.wait_timeout(Some(Duration::from_secs(1)))
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Offer a page and a port to `peer`, publish them in `out`, and answer `rounds` pings.
pub fn offer(peer: DomId, out: &Path, rounds: u32) -> Result<(), String> {
    let p = Platform::detect().map_err(|e| e.to_string())?;
    let page = p
        .share_pages(peer, 1, Access::ReadWrite)
        .map_err(|e| e.to_string())?;
    let ch = p.alloc_unbound(peer).map_err(|e| e.to_string())?;
    let me = p.domid().map_err(|e| e.to_string())?;
    let tmp = out.with_extension("tmp");
    std::fs::write(
        &tmp,
        format!("{} {} {}\n", me, page.grant_refs()[0], ch.local_port()),
    )
    .map_err(|e| e.to_string())?;
    std::fs::rename(&tmp, out).map_err(|e| e.to_string())?;
    // SAFETY: the page is 4096 bytes, page-aligned, and lives until the end of this function.
    let c = unsafe { counter(page.as_ptr()) };
    let deadline = Instant::now() + Duration::from_secs(120);
    for i in 0..rounds {
        wait_for(&ch, c, 2 * i + 1, deadline)?;
        c.store(2 * i + 2, Ordering::Release);
        ch.notify().map_err(|e| e.to_string())?;
    }
    println!("OFFER: {rounds} rounds done");
    Ok(())
}

/// Read what [`offer`] published (waiting for the file to appear).
pub fn read_offer(path: &Path) -> Result<(DomId, GrantRef, EvtchnPort), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            let v: Vec<u32> = s
                .split_whitespace()
                .map(|w| w.parse().map_err(|_| format!("bad offer file {s:?}")))
                .collect::<Result<_, _>>()?;
            if let [d, g, p] = v[..] {
                return Ok((DomId(d as u16), GrantRef(g), EvtchnPort(p)));
            }
            return Err(format!("bad offer file {s:?}"));
        }
        if Instant::now() > deadline {
            return Err(format!("{} never appeared", path.display()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Map the offered page, bind the port, and ping `rounds` times.
pub fn map(offer_file: &Path, rounds: u32) -> Result<(), String> {
    let (peer, gref, port) = read_offer(offer_file)?;
    let p = Platform::detect().map_err(|e| e.to_string())?;
    let m = p
        .map_grants(peer, &[gref], Access::ReadWrite)
        .map_err(|e| e.to_string())?;
    let ch = p.bind_interdomain(peer, port).map_err(|e| e.to_string())?;
    // SAFETY: the mapping is 4096 bytes, page-aligned, and lives until the end of this function.
    let c = unsafe { counter(m.as_ptr()) };
    let deadline = Instant::now() + Duration::from_secs(120);
    for i in 0..rounds {
        c.store(2 * i + 1, Ordering::Release);
        ch.notify().map_err(|e| e.to_string())?;
        wait_for(&ch, c, 2 * i + 2, deadline)?;
    }
    println!(
        "MAP: {rounds} rounds done, counter {}",
        c.load(Ordering::Acquire)
    );
    Ok(())
}
