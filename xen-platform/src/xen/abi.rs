//! The Linux Xen device uapi: struct layouts and ioctl numbers of `gntalloc.h`, `gntdev.h` and
//! `evtchn.h` (`/usr/include/xen/`, and `/usr/include/xen/sys/` from libxen-dev). Checked
//! against the C headers by the `abi_matches_c_headers` test, which compiles a C program.
//!
//! Variable-length structs (`gref_ids[1]`, `refs[1]`) are declared with their one-element
//! tail, as in C; callers build longer buffers themselves (see [`VarBuf`]).

#![allow(missing_docs)]

use std::os::fd::AsFd;

use rustix::ioctl::{Ioctl, IoctlOutput, Opcode};

/// `_IOC(_IOC_NONE, group, nr, size)`: direction bits 0, size in bits 16..30.
pub const fn ioc_none(group: u8, nr: u8, size: usize) -> u32 {
    ((size as u32) << 16) | ((group as u32) << 8) | nr as u32
}

// ---- gntalloc.h ----

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct GntallocAllocGref {
    pub domid: u16,
    pub flags: u16,
    pub count: u32,
    pub index: u64,
    pub gref_ids: [u32; 1],
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct GntallocDeallocGref {
    pub index: u64,
    pub count: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct GntallocUnmapNotify {
    pub index: u64,
    pub action: u32,
    pub event_channel_port: u32,
}

pub const GNTALLOC_FLAG_WRITABLE: u16 = 1;
pub const IOCTL_GNTALLOC_ALLOC_GREF: u32 =
    ioc_none(b'G', 5, std::mem::size_of::<GntallocAllocGref>());
pub const IOCTL_GNTALLOC_DEALLOC_GREF: u32 =
    ioc_none(b'G', 6, std::mem::size_of::<GntallocDeallocGref>());
pub const IOCTL_GNTALLOC_SET_UNMAP_NOTIFY: u32 =
    ioc_none(b'G', 7, std::mem::size_of::<GntallocUnmapNotify>());

// ---- gntdev.h ----

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct GntdevGrantRef {
    pub domid: u32,
    pub ref_: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct GntdevMapGrantRef {
    pub count: u32,
    pub pad: u32,
    pub index: u64,
    pub refs: [GntdevGrantRef; 1],
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct GntdevUnmapGrantRef {
    pub index: u64,
    pub count: u32,
    pub pad: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct GntdevUnmapNotify {
    pub index: u64,
    pub action: u32,
    pub event_channel_port: u32,
}

pub const IOCTL_GNTDEV_MAP_GRANT_REF: u32 =
    ioc_none(b'G', 0, std::mem::size_of::<GntdevMapGrantRef>());
pub const IOCTL_GNTDEV_UNMAP_GRANT_REF: u32 =
    ioc_none(b'G', 1, std::mem::size_of::<GntdevUnmapGrantRef>());
pub const IOCTL_GNTDEV_SET_UNMAP_NOTIFY: u32 =
    ioc_none(b'G', 7, std::mem::size_of::<GntdevUnmapNotify>());

pub const UNMAP_NOTIFY_CLEAR_BYTE: u32 = 0x1;
pub const UNMAP_NOTIFY_SEND_EVENT: u32 = 0x2;

// ---- evtchn.h ----

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct EvtchnBindInterdomain {
    pub remote_domain: u32,
    pub remote_port: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct EvtchnBindUnboundPort {
    pub remote_domain: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct EvtchnUnbind {
    pub port: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct EvtchnNotify {
    pub port: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct EvtchnRestrictDomid {
    pub domid: u16,
}

pub const IOCTL_EVTCHN_BIND_INTERDOMAIN: u32 =
    ioc_none(b'E', 1, std::mem::size_of::<EvtchnBindInterdomain>());
pub const IOCTL_EVTCHN_BIND_UNBOUND_PORT: u32 =
    ioc_none(b'E', 2, std::mem::size_of::<EvtchnBindUnboundPort>());
pub const IOCTL_EVTCHN_UNBIND: u32 = ioc_none(b'E', 3, std::mem::size_of::<EvtchnUnbind>());
pub const IOCTL_EVTCHN_NOTIFY: u32 = ioc_none(b'E', 4, std::mem::size_of::<EvtchnNotify>());
pub const IOCTL_EVTCHN_RESET: u32 = ioc_none(b'E', 5, 0);
pub const IOCTL_EVTCHN_RESTRICT_DOMID: u32 =
    ioc_none(b'E', 6, std::mem::size_of::<EvtchnRestrictDomid>());

/// An 8-byte-aligned, zeroed buffer for a variable-length ioctl argument (header + `n` tail
/// entries), since the tail makes it longer than the Rust struct.
pub struct VarBuf {
    words: Vec<u64>,
}

impl VarBuf {
    /// A zeroed buffer of at least `bytes` bytes.
    pub fn new(bytes: usize) -> VarBuf {
        VarBuf {
            words: vec![0u64; bytes.div_ceil(8)],
        }
    }

    pub fn len(&self) -> usize {
        self.words.len() * 8
    }

    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    pub fn put_u16(&mut self, off: usize, v: u16) {
        self.bytes_mut()[off..off + 2].copy_from_slice(&v.to_ne_bytes());
    }

    pub fn put_u32(&mut self, off: usize, v: u32) {
        self.bytes_mut()[off..off + 4].copy_from_slice(&v.to_ne_bytes());
    }

    pub fn get_u32(&self, off: usize) -> u32 {
        u32::from_ne_bytes(self.bytes()[off..off + 4].try_into().expect("4 bytes"))
    }

    pub fn get_u64(&self, off: usize) -> u64 {
        u64::from_ne_bytes(self.bytes()[off..off + 8].try_into().expect("8 bytes"))
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: a Vec<u64>'s storage is len*8 initialised bytes; u8 has no alignment needs.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast(), self.words.len() * 8) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and we hold &mut self.
        unsafe {
            std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast(), self.words.len() * 8)
        }
    }

    pub fn as_mut_ptr(&mut self) -> *mut std::ffi::c_void {
        self.words.as_mut_ptr().cast()
    }
}

/// An ioctl on a raw argument pointer, returning the ioctl's non-negative result.
struct RawIoctl {
    opcode: u32,
    arg: *mut std::ffi::c_void,
}

// SAFETY: `ioctl_raw`'s caller guarantees that `arg` points to a buffer of the layout `opcode`
// expects (for variable-length arguments, long enough for the count it carries); the kernel may
// write into it (IS_MUTATING), and the output is only the integer return value.
unsafe impl Ioctl for RawIoctl {
    type Output = IoctlOutput;
    const IS_MUTATING: bool = true;

    fn opcode(&self) -> Opcode {
        self.opcode as Opcode
    }

    fn as_ptr(&mut self) -> *mut std::ffi::c_void {
        self.arg
    }

    unsafe fn output_from_ptr(
        out: IoctlOutput,
        _extract_output: *mut std::ffi::c_void,
    ) -> rustix::io::Result<IoctlOutput> {
        Ok(out)
    }
}

/// Issue `opcode` on `fd` with `arg`.
///
/// # Safety
/// `arg` must point to a writable buffer laid out as `opcode`'s argument struct, long enough for
/// any variable-length tail the struct's count field announces.
pub unsafe fn ioctl_raw(
    fd: impl AsFd,
    opcode: u32,
    arg: *mut std::ffi::c_void,
) -> std::io::Result<i32> {
    // SAFETY: forwarded to the caller (see the function's contract).
    unsafe { rustix::ioctl::ioctl(fd, RawIoctl { opcode, arg }) }.map_err(Into::into)
}

/// Issue `opcode` with a fixed-size argument struct.
///
/// # Safety
/// `T` must be exactly the argument struct `opcode` expects (ABI-checked in this module).
pub unsafe fn ioctl_struct<T>(fd: impl AsFd, opcode: u32, arg: &mut T) -> std::io::Result<i32> {
    // SAFETY: `arg` is a live, exclusive, properly laid-out T (caller's contract).
    unsafe { ioctl_raw(fd, opcode, (arg as *mut T).cast()) }
}

/// Every size, offset and ioctl number of this module, by the C name, for the ABI test.
pub fn layout_table() -> Vec<(&'static str, u64)> {
    use std::mem::{offset_of, size_of};
    macro_rules! sz {
        ($c:literal, $t:ty) => {
            (concat!("sizeof ", $c), size_of::<$t>() as u64)
        };
    }
    macro_rules! off {
        ($c:literal, $t:ty, $f:ident) => {
            (
                concat!("offsetof ", $c, ".", stringify!($f)),
                offset_of!($t, $f) as u64,
            )
        };
    }
    vec![
        sz!("ioctl_gntalloc_alloc_gref", GntallocAllocGref),
        off!("ioctl_gntalloc_alloc_gref", GntallocAllocGref, domid),
        off!("ioctl_gntalloc_alloc_gref", GntallocAllocGref, flags),
        off!("ioctl_gntalloc_alloc_gref", GntallocAllocGref, count),
        off!("ioctl_gntalloc_alloc_gref", GntallocAllocGref, index),
        off!("ioctl_gntalloc_alloc_gref", GntallocAllocGref, gref_ids),
        sz!("ioctl_gntalloc_dealloc_gref", GntallocDeallocGref),
        off!("ioctl_gntalloc_dealloc_gref", GntallocDeallocGref, index),
        off!("ioctl_gntalloc_dealloc_gref", GntallocDeallocGref, count),
        sz!("ioctl_gntalloc_unmap_notify", GntallocUnmapNotify),
        off!("ioctl_gntalloc_unmap_notify", GntallocUnmapNotify, index),
        off!("ioctl_gntalloc_unmap_notify", GntallocUnmapNotify, action),
        off!(
            "ioctl_gntalloc_unmap_notify",
            GntallocUnmapNotify,
            event_channel_port
        ),
        sz!("ioctl_gntdev_grant_ref", GntdevGrantRef),
        off!("ioctl_gntdev_grant_ref", GntdevGrantRef, domid),
        (
            "offsetof ioctl_gntdev_grant_ref.ref",
            offset_of!(GntdevGrantRef, ref_) as u64,
        ),
        sz!("ioctl_gntdev_map_grant_ref", GntdevMapGrantRef),
        off!("ioctl_gntdev_map_grant_ref", GntdevMapGrantRef, count),
        off!("ioctl_gntdev_map_grant_ref", GntdevMapGrantRef, pad),
        off!("ioctl_gntdev_map_grant_ref", GntdevMapGrantRef, index),
        off!("ioctl_gntdev_map_grant_ref", GntdevMapGrantRef, refs),
        sz!("ioctl_gntdev_unmap_grant_ref", GntdevUnmapGrantRef),
        off!("ioctl_gntdev_unmap_grant_ref", GntdevUnmapGrantRef, index),
        off!("ioctl_gntdev_unmap_grant_ref", GntdevUnmapGrantRef, count),
        off!("ioctl_gntdev_unmap_grant_ref", GntdevUnmapGrantRef, pad),
        sz!("ioctl_gntdev_unmap_notify", GntdevUnmapNotify),
        off!("ioctl_gntdev_unmap_notify", GntdevUnmapNotify, index),
        off!("ioctl_gntdev_unmap_notify", GntdevUnmapNotify, action),
        off!(
            "ioctl_gntdev_unmap_notify",
            GntdevUnmapNotify,
            event_channel_port
        ),
        sz!("ioctl_evtchn_bind_interdomain", EvtchnBindInterdomain),
        off!(
            "ioctl_evtchn_bind_interdomain",
            EvtchnBindInterdomain,
            remote_domain
        ),
        off!(
            "ioctl_evtchn_bind_interdomain",
            EvtchnBindInterdomain,
            remote_port
        ),
        sz!("ioctl_evtchn_bind_unbound_port", EvtchnBindUnboundPort),
        off!(
            "ioctl_evtchn_bind_unbound_port",
            EvtchnBindUnboundPort,
            remote_domain
        ),
        sz!("ioctl_evtchn_unbind", EvtchnUnbind),
        sz!("ioctl_evtchn_notify", EvtchnNotify),
        sz!("ioctl_evtchn_restrict_domid", EvtchnRestrictDomid),
        ("GNTALLOC_FLAG_WRITABLE", GNTALLOC_FLAG_WRITABLE as u64),
        ("UNMAP_NOTIFY_CLEAR_BYTE", UNMAP_NOTIFY_CLEAR_BYTE as u64),
        ("UNMAP_NOTIFY_SEND_EVENT", UNMAP_NOTIFY_SEND_EVENT as u64),
        (
            "IOCTL_GNTALLOC_ALLOC_GREF",
            IOCTL_GNTALLOC_ALLOC_GREF as u64,
        ),
        (
            "IOCTL_GNTALLOC_DEALLOC_GREF",
            IOCTL_GNTALLOC_DEALLOC_GREF as u64,
        ),
        (
            "IOCTL_GNTALLOC_SET_UNMAP_NOTIFY",
            IOCTL_GNTALLOC_SET_UNMAP_NOTIFY as u64,
        ),
        (
            "IOCTL_GNTDEV_MAP_GRANT_REF",
            IOCTL_GNTDEV_MAP_GRANT_REF as u64,
        ),
        (
            "IOCTL_GNTDEV_UNMAP_GRANT_REF",
            IOCTL_GNTDEV_UNMAP_GRANT_REF as u64,
        ),
        (
            "IOCTL_GNTDEV_SET_UNMAP_NOTIFY",
            IOCTL_GNTDEV_SET_UNMAP_NOTIFY as u64,
        ),
        (
            "IOCTL_EVTCHN_BIND_INTERDOMAIN",
            IOCTL_EVTCHN_BIND_INTERDOMAIN as u64,
        ),
        (
            "IOCTL_EVTCHN_BIND_UNBOUND_PORT",
            IOCTL_EVTCHN_BIND_UNBOUND_PORT as u64,
        ),
        ("IOCTL_EVTCHN_UNBIND", IOCTL_EVTCHN_UNBIND as u64),
        ("IOCTL_EVTCHN_NOTIFY", IOCTL_EVTCHN_NOTIFY as u64),
        ("IOCTL_EVTCHN_RESET", IOCTL_EVTCHN_RESET as u64),
        (
            "IOCTL_EVTCHN_RESTRICT_DOMID",
            IOCTL_EVTCHN_RESTRICT_DOMID as u64,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::path::Path;
    use std::process::Command;

    /// Compile `tests/abi/xen_uapi_abi.c` against one header flavour and return its table.
    fn c_table(variant_define: &str) -> BTreeMap<String, u64> {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/abi/xen_uapi_abi.c");
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("abi");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let out = Command::new(&cc)
            .arg(variant_define)
            .arg("-o")
            .arg(&exe)
            .arg(&src)
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "ABI TEST DID NOT RUN: cannot start the C compiler `{cc}`: {e} \
                     (apt-get install gcc libc6-dev libxen-dev)"
                )
            });
        assert!(
            out.status.success(),
            "ABI TEST DID NOT RUN: compiling {} with {variant_define} failed (are libxen-dev and \
             linux-libc-dev installed?):\n{}",
            src.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let run = Command::new(&exe).output().unwrap();
        assert!(run.status.success());
        String::from_utf8(run.stdout)
            .unwrap()
            .lines()
            .map(|l| {
                let (k, v) = l.rsplit_once(' ').expect("`name value` lines");
                (k.to_string(), v.parse().expect("decimal value"))
            })
            .collect()
    }

    fn compare(c: &BTreeMap<String, u64>, rust: &[(&str, u64)]) -> Result<(), String> {
        if c.len() != rust.len() {
            return Err("the C program and layout_table() list different items".into());
        }
        for (name, value) in rust {
            match c.get(*name) {
                None => return Err(format!("C program lacks {name}")),
                Some(cv) if cv != value => {
                    return Err(format!("{name}: C says {cv}, Rust says {value}"))
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    fn check(variant_define: &str) {
        let c = c_table(variant_define);
        if let Err(e) = compare(&c, &layout_table()) {
            panic!("{variant_define}: {e}");
        }
        // The comparison can fail: a single wrong number is caught.
        let mut wrong = layout_table();
        wrong[3].1 += 1;
        let (name, value) = wrong[3];
        assert_eq!(
            compare(&c, &wrong),
            Err(format!("{name}: C says {}, Rust says {value}", value - 1))
        );
    }

    /// The kernel uapi headers as installed at `/usr/include/xen/{gntalloc,gntdev,evtchn}.h`.
    #[test]
    fn abi_matches_kernel_uapi_headers() {
        check("-DXEN_UAPI_TOPLEVEL");
    }

    /// The copies libxen-dev installs at `/usr/include/xen/sys/{gntalloc,gntdev,evtchn}.h`.
    #[test]
    fn abi_matches_libxen_dev_sys_headers() {
        check("-DXEN_UAPI_SYS");
    }

    #[test]
    fn ioc_none_is_the_linux_encoding() {
        // _IOC(_IOC_NONE, 'G', 5, 24) computed by hand: size<<16 | 'G'<<8 | nr.
        assert_eq!(ioc_none(b'G', 5, 24), 0x0018_4705);
        // rustix computes the same for "no direction".
        assert_eq!(
            ioc_none(b'E', 2, 4) as Opcode,
            rustix::ioctl::opcode::from_components(rustix::ioctl::Direction::None, b'E', 2, 4)
        );
    }

    #[test]
    fn var_buf_round_trips() {
        let mut b = VarBuf::new(20);
        assert_eq!(b.len(), 24);
        b.put_u32(16, 0xdead_beef);
        b.put_u16(2, 7);
        assert_eq!(b.get_u32(16), 0xdead_beef);
        assert_eq!(b.get_u32(0), 7 << 16);
        assert_eq!(b.get_u64(8), 0);
    }
}
