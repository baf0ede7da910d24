//! Grant tables: pages a domain shares (the gntalloc side), mappings of another domain's grants
//! (the gntdev side), and the unmap-notify each can carry.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use rustix::fs::{MemfdFlags, Mode, OFlags, SealFlags};

use super::super::proto::{self, Failure, Reply, Segment};
use super::super::sock;
use super::super::wire::MAX_FDS;
use super::evtchn;
use super::{fail, io_fail, Domain, State, E2BIG, EINVAL, ENOSPC, EPERM, ESRCH};
use crate::types::{DomId, UnmapNotify, PAGE_SIZE};

/// Pages of one allocation: one memfd (read-only views are reopened on demand, so the host
/// holds one descriptor per allocation).
pub(super) struct PageFile {
    pub(super) rw: OwnedFd,
    pub(super) pages: u32,
}

pub(super) struct Grant {
    pub(super) page: u32,
    pub(super) to: u16,
    pub(super) writable: bool,
    pub(super) file: Arc<PageFile>,
}

pub(super) struct Alloc {
    pub(super) owner: u64,
    pub(super) grefs: Vec<u32>,
    pub(super) file: Arc<PageFile>,
    pub(super) notify: Option<Notify>,
}

pub(super) struct MapEntry {
    pub(super) owner: u64,
    pub(super) pages: Vec<(Arc<PageFile>, u32)>,
    pub(super) notify: Option<Notify>,
}

#[derive(Clone, Copy)]
pub(super) struct Notify {
    pub(super) action: u32,
    pub(super) offset: u64,
    pub(super) port: u32,
}

/// Xen reserves the first grant references (`GNTTAB_NR_RESERVED_ENTRIES`).
pub(super) const FIRST_GREF: u32 = 8;

fn owned_alloc(st: &State, domid: u16, conn: u64, handle: u64) -> Result<(), Failure> {
    match st.domains.get(&domid).and_then(|d| d.allocs.get(&handle)) {
        Some(a) if a.owner == conn => Ok(()),
        _ => Err(fail(
            EINVAL,
            format!("no grant allocation {handle} in this process"),
        )),
    }
}

fn owned_map(st: &State, domid: u16, conn: u64, handle: u64) -> Result<(), Failure> {
    match st.domains.get(&domid).and_then(|d| d.maps.get(&handle)) {
        Some(m) if m.owner == conn => Ok(()),
        _ => Err(fail(EINVAL, format!("no mapping {handle} in this process"))),
    }
}

fn check_notify(
    d: &Domain,
    action: u32,
    offset: u64,
    port: u32,
    len: u64,
) -> Result<Option<Notify>, Failure> {
    if action & !(UnmapNotify::CLEAR_BYTE | UnmapNotify::SEND_EVENT) != 0 {
        return Err(fail(
            EINVAL,
            format!("unknown unmap-notify action bits {action:#x}"),
        ));
    }
    if action & UnmapNotify::CLEAR_BYTE != 0 && offset >= len {
        return Err(fail(
            EINVAL,
            format!("byte {offset} is outside the {len}-byte region"),
        ));
    }
    if action & UnmapNotify::SEND_EVENT != 0 && !d.ports.contains_key(&port) {
        return Err(fail(
            EINVAL,
            format!("port {port} is not bound in this domain"),
        ));
    }
    Ok((action != 0).then_some(Notify {
        action,
        offset,
        port,
    }))
}

fn new_page_file(domid: u16, count: u32) -> std::io::Result<PageFile> {
    let rw = rustix::fs::memfd_create(
        format!("vrdma-grant-dom{domid}"),
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )?;
    rustix::fs::ftruncate(&rw, count as u64 * PAGE_SIZE as u64)?;
    // Nobody may resize granted pages (a shrink would SIGBUS every mapper).
    rustix::fs::fcntl_add_seals(&rw, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
    Ok(PageFile { rw, pages: count })
}

impl PageFile {
    /// A descriptor to hand a mapper. Read-only is a new open file description opened
    /// `O_RDONLY`: mapping it `PROT_WRITE` (or `mprotect`ing it so) fails with EACCES, which is
    /// what makes read-only grants read-only for the mapper.
    fn descriptor(&self, writable: bool) -> std::io::Result<OwnedFd> {
        if writable {
            return sock::dup(&self.rw);
        }
        let path = format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&self.rw)
        );
        rustix::fs::open(path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).map_err(Into::into)
    }
}

/// `GrantDealloc`: end a grant allocation of this connection.
pub(super) fn dealloc(
    st: &mut State,
    domid: u16,
    conn: u64,
    handle: u64,
) -> Result<Reply, Failure> {
    owned_alloc(st, domid, conn, handle)?;
    release_alloc(st, domid, handle);
    Ok(Reply::Done)
}

/// `GrantNotify`: what to do when a grant allocation of this connection ends.
#[allow(clippy::too_many_arguments)]
pub(super) fn set_alloc_notify(
    st: &mut State,
    domid: u16,
    conn: u64,
    handle: u64,
    action: u32,
    offset: u64,
    port: u32,
) -> Result<Reply, Failure> {
    owned_alloc(st, domid, conn, handle)?;
    let d = st.domains.get_mut(&domid).expect("checked");
    let len = d.allocs[&handle].file.pages as u64 * PAGE_SIZE as u64;
    let n = check_notify(d, action, offset, port, len)?;
    d.allocs.get_mut(&handle).expect("checked").notify = n;
    Ok(Reply::Done)
}

/// `Unmap`: end a mapping of this connection.
pub(super) fn unmap(st: &mut State, domid: u16, conn: u64, handle: u64) -> Result<Reply, Failure> {
    owned_map(st, domid, conn, handle)?;
    release_map(st, domid, handle);
    Ok(Reply::Done)
}

/// `MapNotify`: what to do when a mapping of this connection ends.
#[allow(clippy::too_many_arguments)]
pub(super) fn set_map_notify(
    st: &mut State,
    domid: u16,
    conn: u64,
    handle: u64,
    action: u32,
    offset: u64,
    port: u32,
) -> Result<Reply, Failure> {
    owned_map(st, domid, conn, handle)?;
    let d = st.domains.get_mut(&domid).expect("checked");
    let len = d.maps[&handle].pages.len() as u64 * PAGE_SIZE as u64;
    let n = check_notify(d, action, offset, port, len)?;
    d.maps.get_mut(&handle).expect("checked").notify = n;
    Ok(Reply::Done)
}

/// `GrantAlloc`: `count` fresh pages granted to `to`, one reference each.
#[allow(clippy::too_many_arguments)]
pub(super) fn alloc(
    st: &mut State,
    handle: u64,
    domid: u16,
    conn: u64,
    to: u16,
    writable: bool,
    count: u32,
) -> Result<(Reply, Arc<OwnedFd>), Failure> {
    if count == 0 || count as usize > proto::MAX_REFS_PER_CALL {
        return Err(fail(
            EINVAL,
            format!(
                "cannot grant {count} pages in one call (1..={})",
                proto::MAX_REFS_PER_CALL
            ),
        ));
    }
    if !DomId(to).is_normal() {
        return Err(fail(EINVAL, format!("{to} is not a domain id")));
    }
    let d = st
        .domains
        .get_mut(&domid)
        .ok_or_else(|| fail(ESRCH, "domain is gone"))?;
    let in_use = d.grants.len() as u64;
    if in_use + count as u64 > d.max_grants as u64 {
        return Err(Failure {
            errno: ENOSPC,
            limit: d.max_grants,
            message: format!(
                "domain {domid} has {in_use} of its {} grants in use and asked for {count} more",
                d.max_grants
            ),
        });
    }
    let file = Arc::new(new_page_file(domid, count).map_err(|e| io_fail("memfd", e))?);
    let mut grefs = Vec::with_capacity(count as usize);
    for page in 0..count {
        while d.grants.contains_key(&d.next_gref) || d.next_gref < FIRST_GREF {
            d.next_gref = d.next_gref.wrapping_add(1);
        }
        let g = d.next_gref;
        d.next_gref = d.next_gref.wrapping_add(1);
        d.grants.insert(
            g,
            Grant {
                page,
                to,
                writable,
                file: Arc::clone(&file),
            },
        );
        grefs.push(g);
    }
    let rw = Arc::new(sock::dup(&file.rw).map_err(|e| fail(EINVAL, format!("dup: {e}")))?);
    d.allocs.insert(
        handle,
        Alloc {
            owner: conn,
            grefs: grefs.clone(),
            file,
            notify: None,
        },
    );
    Ok((Reply::Granted { handle, grefs }, rw))
}

/// `Map`: domain `from`'s grants `refs`, in that order, as segments of its page files.
#[allow(clippy::too_many_arguments)]
pub(super) fn map(
    st: &mut State,
    handle: u64,
    domid: u16,
    conn: u64,
    from: u16,
    writable: bool,
    refs: &[u32],
) -> Result<(Reply, Vec<Arc<OwnedFd>>), Failure> {
    if refs.is_empty() {
        return Err(fail(EINVAL, "no grant references to map"));
    }
    let src = st
        .domains
        .get(&from)
        .ok_or_else(|| fail(ESRCH, format!("no domain {from}")))?;
    let mut pages = Vec::with_capacity(refs.len());
    for &r in refs {
        let g = src
            .grants
            .get(&r)
            .ok_or_else(|| fail(EINVAL, format!("domain {from} has no grant {r}")))?;
        if g.to != domid {
            return Err(fail(
                EPERM,
                format!(
                    "grant {r} of domain {from} is granted to domain {}, not to domain {domid}",
                    g.to
                ),
            ));
        }
        if writable && !g.writable {
            return Err(fail(
                EPERM,
                format!("grant {r} of domain {from} is read-only"),
            ));
        }
        pages.push((Arc::clone(&g.file), g.page));
    }
    // Coalesce runs of consecutive pages of one file; one descriptor per distinct file.
    let mut files: Vec<Arc<PageFile>> = Vec::new();
    let mut segments: Vec<Segment> = Vec::new();
    for (file, page) in &pages {
        let idx = match files.iter().position(|f| Arc::ptr_eq(f, file)) {
            Some(i) => i,
            None => {
                if files.len() == MAX_FDS {
                    return Err(fail(
                        E2BIG,
                        format!(
                            "one mapping may span at most {MAX_FDS} separate grant allocations"
                        ),
                    ));
                }
                files.push(Arc::clone(file));
                files.len() - 1
            }
        } as u32;
        match segments.last_mut() {
            Some(s) if s.fd_index == idx && s.file_page + s.pages as u64 == *page as u64 => {
                s.pages += 1
            }
            _ => segments.push(Segment {
                fd_index: idx,
                file_page: *page as u64,
                pages: 1,
            }),
        }
    }
    let mut fds = Vec::with_capacity(files.len());
    for f in &files {
        fds.push(Arc::new(
            f.descriptor(writable)
                .map_err(|e| io_fail("grant descriptor", e))?,
        ));
    }
    let d = st
        .domains
        .get_mut(&domid)
        .ok_or_else(|| fail(ESRCH, "domain is gone"))?;
    d.maps.insert(
        handle,
        MapEntry {
            owner: conn,
            pages,
            notify: None,
        },
    );
    Ok((Reply::Mapped { handle, segments }, fds))
}

fn fire(d: &Domain, n: Notify, clear: impl FnOnce(u64)) {
    if n.action & UnmapNotify::CLEAR_BYTE != 0 {
        clear(n.offset);
    }
    if n.action & UnmapNotify::SEND_EVENT != 0 {
        if let Some(p) = d.ports.get(&n.port) {
            evtchn::signal(&p.send);
        }
    }
}

fn clear_byte(file: &PageFile, offset: u64) {
    if let Err(e) = rustix::io::pwrite(&file.rw, &[0u8], offset) {
        tracing::warn!("unmap-notify: clearing byte {offset}: {e}");
    }
}

/// Ends a grant allocation: its references go, its unmap-notify fires.
pub(super) fn release_alloc(st: &mut State, domid: u16, handle: u64) {
    let Some(d) = st.domains.get_mut(&domid) else {
        return;
    };
    let Some(a) = d.allocs.remove(&handle) else {
        return;
    };
    for g in &a.grefs {
        d.grants.remove(g);
    }
    if let Some(n) = a.notify {
        fire(d, n, |off| clear_byte(&a.file, off));
    }
}

/// Ends a mapping; its unmap-notify fires.
pub(super) fn release_map(st: &mut State, domid: u16, handle: u64) {
    let Some(d) = st.domains.get_mut(&domid) else {
        return;
    };
    let Some(m) = d.maps.remove(&handle) else {
        return;
    };
    if let Some(n) = m.notify {
        fire(d, n, |off| {
            let (file, page) = &m.pages[(off / PAGE_SIZE as u64) as usize];
            clear_byte(
                file,
                *page as u64 * PAGE_SIZE as u64 + off % PAGE_SIZE as u64,
            );
        });
    }
}
