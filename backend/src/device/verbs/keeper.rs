//! The registration keeper: the HCA registrations of gntdev-mapped guest pages are released
//! before the backend's memory is torn down, even when the backend is killed (SIGKILL).
//!
//! # Why
//!
//! On a PV dom0 gntdev maps a grant by writing the process's PTE through Xen (`use_ptemod`),
//! and undoes it from its MMU notifier when the range is unmapped. While a page is pinned —
//! an HCA registration (`ibv_reg_mr`) pins every page of a guest MR — that unmap is deferred
//! (`gnttab_unmap_refs_async` waits for the page count to drop), so the kernel's page-table
//! teardown goes on over PTEs that are still there and takes them for ordinary pages: "BUG: Bad
//! page map … file:gntdev", "Bad rss-counter state … MM_FILEPAGES val:-N", and the pages'
//! reference counts are dropped once too often. The verbs device deregisters before it unmaps
//! on every path it controls ([`super::device`]'s `MrEntry`), but a killed process has no
//! path: the kernel tears its memory down (`exit_mm`) before it closes its files, and the
//! uverbs file — whose release deregisters — is kept open by the provider's own mappings of it
//! until that same teardown is over. Seen in the Xen lab (scenario `rxe`): after `kill -9` of
//! `vrdma-backend --device verbs:rxe0` holding two 256 KiB guest MRs, dom0 logged bad page maps
//! (60, then the kernel's rate limit) and an rss counter of -128 — all 128 pages — and every `reg_mr` of the restarted backend failed with ENOMEM (NoResources to the
//! guest): the corrupted pages were handed out again by the balloon to gntdev and could not be
//! pinned any more.
//!
//! # How
//!
//! A keeper process shares the backend's memory and file table (`clone(CLONE_VM |
//! CLONE_FILES)`, not a thread: a SIGKILL of the backend does not kill it) and sleeps on a
//! pidfd of the backend. The backend records the kernel handle of every live registration in
//! a table of atomics ([`Keeper::track`]; the slot is cleared after `ibv_dereg_mr`). When the
//! backend is gone — killed or exited — the memory is still there (the keeper holds it), so
//! the keeper destroys every recorded registration with the uverbs ioctl
//! (`UVERBS_METHOD_MR_DESTROY`, which unpins the pages; the kernel wants the driver's id in it,
//! which libibverbs keeps private, so [`Keeper::start`] finds the one the file accepts), then
//! exits; only then is the memory
//! torn down, with nothing pinned, and gntdev unmaps synchronously. The keeper runs nothing but
//! system calls, atomic loads and errno reads: the backend's threads may have died holding any
//! lock.
//!
//! One keeper per [`Keeper::start`] (per opened verbs device); it lives until the process is
//! gone, blocked in `poll`. It needs `pidfd_open` (Linux 5.3). A keeper is killed with the
//! backend only if it is signalled itself (`pkill`, a cgroup kill); stop the service with
//! SIGTERM (docs/operations.md).

use std::ffi::{c_int, c_void};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};

/// A recorded registration: the handle in the low 32 bits, this bit set.
const LIVE: u64 = 1 << 63;

/// `RDMA_VERBS_IOCTL`: `_IOWR(RDMA_IOCTL_MAGIC = 0x1b, 1, struct ib_uverbs_ioctl_hdr)`, the
/// header being 24 bytes (rdma/rdma_user_ioctl_cmds.h).
const RDMA_VERBS_IOCTL: u64 = (3 << 30) | (24 << 16) | (0x1b << 8) | 1;
/// `UVERBS_OBJECT_MR`, `UVERBS_METHOD_MR_DESTROY`, `UVERBS_ATTR_DESTROY_MR_HANDLE`
/// (rdma/ib_user_ioctl_cmds.h: positions in their enums).
const UVERBS_OBJECT_MR: u16 = 7;
const UVERBS_METHOD_MR_DESTROY: u16 = 1;
const UVERBS_ATTR_DESTROY_MR_HANDLE: u16 = 0;
/// `UVERBS_ATTR_F_MANDATORY`.
const UVERBS_ATTR_F_MANDATORY: u16 = 1;

/// `struct ib_uverbs_ioctl_hdr` followed by one `struct ib_uverbs_attr` (an IDR handle).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct DestroyMr {
    length: u16,
    object_id: u16,
    method_id: u16,
    num_attrs: u16,
    reserved1: u64,
    driver_id: u32,
    reserved2: u32,
    attr_id: u16,
    attr_len: u16,
    attr_flags: u16,
    attr_data: u16,
    data: u64,
}

impl DestroyMr {
    fn new(handle: u32, driver_id: u32) -> DestroyMr {
        DestroyMr {
            driver_id,
            length: std::mem::size_of::<DestroyMr>() as u16,
            object_id: UVERBS_OBJECT_MR,
            method_id: UVERBS_METHOD_MR_DESTROY,
            num_attrs: 1,
            attr_id: UVERBS_ATTR_DESTROY_MR_HANDLE,
            attr_flags: UVERBS_ATTR_F_MANDATORY,
            data: u64::from(handle),
            ..Default::default()
        }
    }
}

/// What the keeper reads: set up once, never freed (the keeper may outlive every Rust
/// object of the backend).
struct Shared {
    pidfd: c_int,
    cmd_fd: c_int,
    /// The device driver's `enum rdma_driver_id`: the kernel refuses an ioctl naming another
    /// (EINVAL), and libibverbs keeps it private; found by [`driver_id_of`].
    driver_id: u32,
    /// -1, or where the keeper reports what it destroyed ([`Keeper::start_reporting`]).
    report_fd: c_int,
    slots: Box<[AtomicU64]>,
}

/// The backend side of a keeper: records the registrations it must release.
pub(crate) struct Keeper {
    shared: &'static Shared,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("cmd_fd", &self.cmd_fd)
            .field("slots", &self.slots.len())
            .finish()
    }
}

/// A recorded registration, forgotten when dropped: drop it after `ibv_dereg_mr` (declare it
/// after the registration in a struct).
#[derive(Debug)]
pub(crate) struct Kept {
    shared: &'static Shared,
    slot: usize,
}

impl Drop for Kept {
    fn drop(&mut self) {
        if let Some(s) = self.shared.slots.get(self.slot) {
            s.store(0, Ordering::SeqCst);
        }
    }
}

impl Keeper {
    /// Starts a keeper for registrations made on the uverbs file `cmd_fd` (the context's
    /// `cmd_fd`), at most `capacity` at once.
    pub(crate) fn start(cmd_fd: RawFd, capacity: usize) -> std::io::Result<Keeper> {
        // The unit tests' fake device (`super::fake`) has no uverbs file: no keeper process.
        #[cfg(test)]
        if cmd_fd < 0 {
            return Ok(Keeper {
                shared: Self::table(cmd_fd, capacity, -1)?,
            });
        }
        Self::start_reporting(cmd_fd, capacity, -1)
    }

    /// [`Keeper::start`]; the keeper also writes each handle it destroyed (4 bytes, little
    /// endian) to `report_fd` when that is not -1 (the tests' window on a killed process).
    fn start_reporting(
        cmd_fd: RawFd,
        capacity: usize,
        report_fd: RawFd,
    ) -> std::io::Result<Keeper> {
        let shared = Self::table(cmd_fd, capacity, report_fd)?;
        const STACK: usize = 64 * 1024;
        // SAFETY: a fresh private anonymous mapping (no Rust object lives there); it is the
        // keeper's stack and is never unmapped (the keeper may run after the backend died).
        let stack = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                STACK,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if stack == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `keeper_main` only makes system calls and atomic loads through `shared`,
        // which is leaked ('static); the stack is the mapping above (its top, 16-byte
        // aligned); CLONE_VM | CLONE_FILES: the keeper sees this memory and these files.
        let pid = unsafe {
            libc::clone(
                keeper_main,
                stack.cast::<u8>().add(STACK).cast::<c_void>(),
                libc::CLONE_VM | libc::CLONE_FILES | libc::SIGCHLD,
                (shared as *const Shared).cast_mut().cast::<c_void>(),
            )
        };
        if pid < 0 {
            return Err(std::io::Error::last_os_error());
        }
        tracing::debug!(pid, "verbs device: registration keeper started");
        Ok(Keeper { shared })
    }

    /// The table and the pidfd of this process (no keeper yet).
    fn table(cmd_fd: RawFd, capacity: usize, report_fd: RawFd) -> std::io::Result<&'static Shared> {
        // SAFETY: pidfd_open(2) of this process; no pointer arguments.
        let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) };
        if pidfd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let slots = (0..capacity.max(1)).map(|_| AtomicU64::new(0)).collect();
        let driver_id = driver_id_of(cmd_fd).unwrap_or_else(|| {
            tracing::warn!(
                "verbs device: the uverbs file refuses MR_DESTROY for every driver id: a killed \
                 backend's registrations will not be released before its memory"
            );
            0
        });
        Ok(Box::leak(Box::new(Shared {
            pidfd: pidfd as c_int,
            cmd_fd,
            driver_id,
            report_fd,
            slots,
        })))
    }

    /// Records registration `handle` (`ibv_mr.handle`); `None` when the table is full.
    pub(crate) fn track(&self, handle: u32) -> Option<Kept> {
        let shared = self.shared;
        shared
            .slots
            .iter()
            .position(|s| {
                s.compare_exchange(
                    0,
                    LIVE | u64::from(handle),
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                )
                .is_ok()
            })
            .map(|slot| Kept { shared, slot })
    }

    /// The handles recorded now.
    #[cfg(test)]
    fn recorded(&self) -> Vec<u32> {
        recorded(self.shared).collect()
    }
}

fn recorded(s: &Shared) -> impl Iterator<Item = u32> + '_ {
    s.slots.iter().filter_map(|a| {
        let v = a.load(Ordering::SeqCst);
        (v & LIVE != 0).then_some(v as u32)
    })
}

/// The uverbs ioctl of `cmd` on `fd`: 0 or the errno.
fn destroy(fd: c_int, cmd: &mut DestroyMr) -> i32 {
    // SAFETY: the uverbs ioctl with a request of its layout, which lives across the call; on
    // any other file the kernel refuses the command number.
    let rc = unsafe { libc::ioctl(fd, RDMA_VERBS_IOCTL as _, cmd as *mut DestroyMr) };
    if rc == 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
    }
}

/// The driver id the uverbs file `fd` accepts: an MR_DESTROY of a handle that cannot exist is
/// refused with EINVAL for a wrong driver id and with another error (ENOENT) for the right one.
fn driver_id_of(fd: c_int) -> Option<u32> {
    (0..64).find(|&id| {
        let e = destroy(fd, &mut DestroyMr::new(u32::MAX, id));
        e != 0 && e != libc::EINVAL && e != libc::ENOTTY && e != libc::EBADF
    })
}

/// The keeper: waits until the backend process is gone, destroys what is recorded, exits.
extern "C" fn keeper_main(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the leaked `Shared` of `Keeper::start`, never freed.
    let s = unsafe { &*arg.cast_const().cast::<Shared>() };
    let mut pfd = libc::pollfd {
        fd: s.pidfd,
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: one valid pollfd. (errno, if set, lands in the TLS of the thread that
        // started the keeper: nothing reads it.)
        let n = unsafe { libc::poll(&mut pfd, 1, -1) };
        if n > 0 {
            break;
        }
    }
    for handle in recorded(s) {
        // A stale handle is refused by the kernel; nothing else happens.
        destroy(s.cmd_fd, &mut DestroyMr::new(handle, s.driver_id));
        if s.report_fd >= 0 {
            let b = handle.to_le_bytes();
            // SAFETY: 4 bytes from a live local buffer.
            unsafe { libc::write(s.report_fd, b.as_ptr().cast(), b.len()) };
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_destroy_request_has_the_kernels_layout() {
        // struct ib_uverbs_ioctl_hdr is 24 bytes, struct ib_uverbs_attr 16.
        assert_eq!(std::mem::size_of::<DestroyMr>(), 40);
        let c = DestroyMr::new(0x1234, 14);
        assert_eq!(
            (c.length, c.num_attrs, c.data, c.driver_id),
            (40, 1, 0x1234, 14)
        );
        assert_eq!(std::mem::offset_of!(DestroyMr, attr_id), 24);
        assert_eq!(std::mem::offset_of!(DestroyMr, data), 32);
        assert_eq!(RDMA_VERBS_IOCTL, 0xc018_1b01);
    }

    #[test]
    fn registrations_are_recorded_until_dropped() {
        let k = Keeper {
            shared: Keeper::table(-1, 3, -1).unwrap(),
        };
        let a = k.track(7).unwrap();
        let b = k.track(0).unwrap();
        let c = k.track(9).unwrap();
        assert!(k.track(10).is_none(), "the table is full");
        assert_eq!(k.recorded(), vec![7, 0, 9]);
        drop(b);
        assert_eq!(k.recorded(), vec![7, 9]);
        let d = k.track(11).unwrap();
        assert_eq!(d.slot, 1, "a free slot is reused");
        drop((a, c));
        assert_eq!(k.recorded(), vec![11]);
    }

    /// Both roles of one test: run plainly it is the parent; with `CHILD` set (the parent runs
    /// this test binary again, this test only) it is the process that gets killed.
    #[test]
    fn a_killed_process_s_registrations_are_released_by_its_keeper() {
        use std::io::{BufRead, Read};
        use std::os::fd::FromRawFd;
        use std::time::Duration;
        const CHILD: &str = "VRDMA_KEEPER_TEST_REPORT_FD";
        const NAME: &str =
            "device::verbs::keeper::tests::a_killed_process_s_registrations_are_released_by_its_keeper";
        if let Ok(fd) = std::env::var(CHILD) {
            let k = Keeper::start_reporting(-1, 4, fd.parse().unwrap()).unwrap();
            let kept = [k.track(5).unwrap(), k.track(6).unwrap()];
            drop(k.track(7).unwrap()); // deregistered: not the keeper's business any more
            println!("keeper-test: tracking");
            loop {
                std::thread::sleep(Duration::from_secs(1));
                let _ = &kept;
            }
        }
        let mut fds = [0; 2];
        // SAFETY: pipe(2) into a valid array; no CLOEXEC, so the child inherits the write end.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: fresh descriptors of this process, each owned once.
        let (mut r, w) = unsafe {
            (
                std::fs::File::from_raw_fd(fds[0]),
                std::fs::File::from_raw_fd(fds[1]),
            )
        };
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", NAME, "--test-threads=1", "--nocapture"])
            .env(CHILD, fds[1].to_string())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(w);
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let ready = std::io::BufReader::new(out)
                .lines()
                .map_while(Result::ok)
                .any(|l| l.contains("keeper-test: tracking"));
            let _ = tx.send(ready);
        });
        let ready = rx.recv_timeout(Duration::from_secs(60));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        assert_eq!(ready, Ok(true), "the child never tracked its registrations");
        // The keeper reports, then exits; its copy of the write end (the child's file table)
        // goes with it: EOF. Bounded: read on a thread, wait at most a minute.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut got = Vec::new();
            let _ = r.read_to_end(&mut got);
            let _ = tx.send(got);
        });
        let got = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the keeper neither reported nor exited");
        let handles: Vec<u32> = got
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(
            handles,
            vec![5, 6],
            "what the killed process still held, nothing else"
        );
    }
}
