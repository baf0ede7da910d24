//! Devices and contexts: the device list (the guest's `device/vrdma/<devid>` nodes), open and
//! close, and the query verbs (device, port, GID, P_Key).
//!
//! **What the device reports** (docs/verbs.md): transport `IB`, link layer `Ethernet`, one
//! port, always `ACTIVE`, LID 0, its GID table and one P_Key (0xffff) — what a RoCE device
//! reports, so that AV-based programs (`ibv_rc_pingpong -g 0`) take the GID path and do not
//! ask for a LID. On a verbs device the table is the device port's real one (`QueryGid`:
//! entries with their types, the port's own GID first, at most 16); otherwise it has one
//! entry of type RoCE v2. GID 0 is the backend's address as an IPv6 address (`::ffff:a.b.c.d`
//! for IPv4), or, when the backend publishes none (intra-host only), `fe80::276:72ff:fe00:D`
//! with D the backend's domain id. Every guest of one backend reports the same GID: it names
//! the backend, and a QP's address vector with that GID (or without a GRH) means "a QP on this
//! backend", paired by QP number.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::mem::{offset_of, size_of};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};

use verbs_abi::verbs::*;
use vrdma::DeviceAttrs;

use crate::errno::*;
use crate::objects::{self, Watch};
use crate::{fail, guard, set_errno};

/// An `ibv_device` of this library (first field: `*mut Dev` is the `*mut ibv_device`).
#[repr(C)]
pub(crate) struct Dev {
    pub dev: ibv_device,
    pub devid: u32,
}

/// Devices handed out so far, never freed (programs keep `ibv_device *` across
/// `ibv_free_device_list`, as libibverbs allows).
static DEVICES: Mutex<Vec<usize>> = Mutex::new(Vec::new());

fn set_cstr(dst: &mut [c_char], s: &str) {
    for (d, b) in dst.iter_mut().zip(s.bytes().chain(std::iter::once(0))) {
        *d = b as c_char;
    }
    if let Some(last) = dst.last_mut() {
        *last = 0;
    }
}

/// The device ids under this domain's `device/vrdma` (empty when this is no guest of a vrdma
/// backend: no platform, no XenStore, no node).
fn devids() -> Vec<u32> {
    let Ok(platform) = xen_platform::Platform::detect() else {
        return Vec::new();
    };
    let Ok(xs) = platform.xenstore() else {
        return Vec::new();
    };
    let mut ids: Vec<u32> = xs
        .directory("device/vrdma")
        .unwrap_or_default()
        .iter()
        .filter_map(|n| n.parse().ok())
        .collect();
    ids.sort_unstable();
    ids
}

fn device_for(devid: u32) -> *mut Dev {
    let mut list = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    for &p in list.iter() {
        // SAFETY: every entry is a leaked `Box<Dev>`, never freed.
        if unsafe { (*(p as *const Dev)).devid } == devid {
            return p as *mut Dev;
        }
    }
    // SAFETY: all-zero is a valid ibv_device (null ops, zero enums, empty strings).
    let mut dev: ibv_device = unsafe { std::mem::zeroed() };
    dev.node_type = IBV_NODE_CA;
    dev.transport_type = IBV_TRANSPORT_IB;
    set_cstr(&mut dev.name, &format!("vrdma{devid}"));
    set_cstr(&mut dev.dev_name, &format!("uverbs-vrdma{devid}"));
    set_cstr(&mut dev.dev_path, &format!("/dev/vrdma/{devid}"));
    set_cstr(
        &mut dev.ibdev_path,
        &format!("/sys/class/vrdma/vrdma{devid}"),
    );
    let p = Box::into_raw(Box::new(Dev { dev, devid }));
    list.push(p as usize);
    p
}

/// The devices of a `ibv_device **` list of [`vrdma_verbs_ibv_get_device_list`].
fn dev_of(d: *mut ibv_device) -> Option<&'static Dev> {
    if d.is_null() {
        return None;
    }
    let list = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    // Only our own devices: a pointer from elsewhere is refused, not dereferenced.
    list.contains(&(d as usize))
        // SAFETY: a leaked `Box<Dev>` of ours (checked above), never freed.
        .then(|| unsafe { &*(d as *const Dev) })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device {
    guard(std::ptr::null_mut(), || {
        let mut v: Vec<*mut ibv_device> = devids()
            .into_iter()
            .map(|id| device_for(id).cast::<ibv_device>())
            .collect();
        let n = v.len();
        v.push(std::ptr::null_mut());
        if !num.is_null() {
            // SAFETY: the caller passes a valid `int *` or NULL (checked).
            unsafe { *num = n as c_int };
        }
        Box::into_raw(v.into_boxed_slice()).cast::<*mut ibv_device>()
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_free_device_list(list: *mut *mut ibv_device) {
    guard((), || {
        if list.is_null() {
            return;
        }
        let mut n = 0;
        // SAFETY: `list` came from ibv_get_device_list: NULL-terminated, n+1 entries.
        while !unsafe { *list.add(n) }.is_null() {
            n += 1;
        }
        // SAFETY: it was a `Box<[*mut ibv_device]>` of n+1 entries.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(list, n + 1)) });
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_get_device_name(d: *mut ibv_device) -> *const c_char {
    guard(std::ptr::null(), || match dev_of(d) {
        Some(dev) => dev.dev.name.as_ptr(),
        None => {
            set_errno(EINVAL);
            std::ptr::null()
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_get_device_index(d: *mut ibv_device) -> c_int {
    guard(-1, || dev_of(d).map_or(-1, |dev| dev.devid as c_int))
}

/// Node GUID (host order): `02:76:72:64` ("vrd"), the guest's domain id, the device id.
fn guid(devid: u32) -> u64 {
    let domid = xen_platform::Platform::detect()
        .ok()
        .and_then(|p| p.domid().ok())
        .map_or(0, |d| u64::from(d.0));
    0x0276_7264_0000_0000 | (domid << 16) | u64::from(devid & 0xffff)
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_get_device_guid(d: *mut ibv_device) -> u64 {
    guard(0, || dev_of(d).map_or(0, |dev| guid(dev.devid).to_be()))
}

/// An open device: `struct verbs_context` (which ends with the `ibv_context` programs see)
/// followed by this library's state.
#[repr(C)]
pub(crate) struct Ctx {
    pub vctx: verbs_context,
    pub vr: vrdma::Context,
    pub devid: u32,
    pub attrs: DeviceAttrs,
    /// GID 0 (`gids[0]`'s GID).
    pub gid: [u8; 16],
    /// The GID table: (GID, `enum ibv_gid_type`), the backend's (`QueryGid`, a verbs
    /// device's real table) or one entry, the backend's address as RoCE v2.
    pub gids: Vec<([u8; 16], u32)>,
    pub guid: u64,
    /// CQ completion events and asynchronous events (`async_fd` is `watch.events.rd`).
    pub watch: Arc<Watch>,
    /// Live QPs and CQs by backend handle (asynchronous events name them so).
    pub qps: Mutex<std::collections::HashMap<u32, usize>>,
    pub cqs: Mutex<std::collections::HashMap<u32, usize>>,
    /// QP numbers whose flushed receives the program gets: QPs that reported an error
    /// completion of their own or that the program moved to ERR (see `objects::poll_cq`).
    pub flushing: Mutex<std::collections::HashSet<u32>>,
}

impl Ctx {
    /// The context of a program's `ibv_context *` (NULL gives None).
    ///
    /// # Safety
    /// `c` must be NULL or a context of [`vrdma_verbs_ibv_open_device`] not yet closed.
    pub unsafe fn of<'a>(c: *mut ibv_context) -> Option<&'a Ctx> {
        if c.is_null() {
            return None;
        }
        let p = c
            .cast::<u8>()
            .wrapping_sub(offset_of!(Ctx, vctx) + offset_of!(verbs_context, context));
        // SAFETY: the caller's contract: `c` is `&ctx.vctx.context` of a live `Ctx`.
        Some(unsafe { &*p.cast::<Ctx>() })
    }
}

/// GID 0: see the module documentation.
fn gid_for(ctx: &vrdma::Context) -> [u8; 16] {
    let a = ctx.backend_addr_raw();
    if a != [0; 16] {
        return a;
    }
    let d = ctx.backend_domid().0.to_be_bytes();
    [
        0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x76, 0x72, 0xff, 0xfe, 0, d[0], d[1],
    ]
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_open_device(d: *mut ibv_device) -> *mut ibv_context {
    guard(std::ptr::null_mut(), || {
        let Some(dev) = dev_of(d) else {
            set_errno(EINVAL);
            return std::ptr::null_mut();
        };
        let vr = match vrdma::Context::builder().devid(dev.devid).open() {
            Ok(c) => c,
            Err(e) => {
                set_errno(fail("ibv_open_device", &e));
                return std::ptr::null_mut();
            }
        };
        let attrs = match vr.query_device() {
            Ok(a) => a,
            Err(e) => {
                set_errno(fail("ibv_open_device: query", &e));
                return std::ptr::null_mut();
            }
        };
        let (async_rd, async_wr) = match rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC) {
            Ok(p) => p,
            Err(e) => {
                set_errno(e.raw_os_error());
                return std::ptr::null_mut();
            }
        };
        // SAFETY: all-zero is a valid verbs_context: NULL ops, zero sizes, an all-zero
        // pthread mutex (PTHREAD_MUTEX_INITIALIZER on glibc).
        let mut vctx: verbs_context = unsafe { std::mem::zeroed() };
        vctx.sz = size_of::<verbs_context>();
        vctx.query_port = Some(query_port_ex);
        vctx.context.device = d;
        vctx.context.ops = objects::context_ops();
        vctx.context.cmd_fd = -1;
        vctx.context.async_fd = async_rd.as_raw_fd();
        vctx.context.num_comp_vectors = 1;
        vctx.context.abi_compat = VERBS_ABI_IS_EXTENDED as *mut c_void;
        let gids = match vr.query_gids() {
            Ok(Some(t)) => t,
            Ok(None) => vec![(gid_for(&vr), IBV_GID_TYPE_ROCE_V2)],
            Err(e) => {
                tracing::debug!("QueryGid: {e}; GID 0 is the backend's address");
                vec![(gid_for(&vr), IBV_GID_TYPE_ROCE_V2)]
            }
        };
        let gid = gids[0].0;
        let watch = Watch::new(vr.clone(), async_rd, async_wr);
        watch.want_events();
        let ctx = Box::new(Ctx {
            vctx,
            vr,
            devid: dev.devid,
            attrs,
            gid,
            gids,
            guid: guid(dev.devid),
            watch,
            qps: Mutex::new(Default::default()),
            cqs: Mutex::new(Default::default()),
            flushing: Mutex::new(Default::default()),
        });
        let p = Box::into_raw(ctx);
        // SAFETY: `p` is a live Box; the program gets the address of its embedded context.
        unsafe { std::ptr::addr_of_mut!((*p).vctx.context) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_close_device(c: *mut ibv_context) -> c_int {
    guard(EIO, || {
        if c.is_null() {
            return EINVAL;
        }
        // SAFETY: C contract: a context of ours, closed once.
        let ctx = unsafe { Ctx::of(c) }.expect("not null");
        ctx.watch.stop();
        let p = (ctx as *const Ctx).cast_mut();
        // SAFETY: `p` came from Box::into_raw in ibv_open_device.
        drop(unsafe { Box::from_raw(p) });
        0
    })
}

fn device_attr(ctx: &Ctx) -> ibv_device_attr {
    let a = &ctx.attrs;
    let i = |v: u32| v.min(i32::MAX as u32) as c_int;
    let mut d = ibv_device_attr::default();
    set_cstr(&mut d.fw_ver, env!("CARGO_PKG_VERSION"));
    d.node_guid = ctx.guid.to_be();
    d.sys_image_guid = ctx.guid.to_be();
    d.max_mr_size = u64::from(a.max_mr_pages) * 4096;
    d.page_size_cap = 4096;
    d.vendor_id = 0;
    d.vendor_part_id = 0;
    d.hw_ver = 0;
    d.max_qp = i(a.max_qp);
    d.max_qp_wr = i(a.max_qp_wr);
    d.device_cap_flags = 0;
    d.max_sge = i(a.max_sge);
    d.max_sge_rd = i(a.max_sge);
    d.max_cq = i(a.max_cq);
    d.max_cqe = i(a.max_cqe);
    d.max_mr = i(a.max_mr);
    d.max_pd = i(a.max_pd);
    d.max_qp_rd_atom = 16;
    d.max_res_rd_atom = 16 * i(a.max_qp);
    d.max_qp_init_rd_atom = 16;
    d.atomic_cap = IBV_ATOMIC_NONE;
    d.max_pkeys = 1;
    d.local_ca_ack_delay = 0;
    d.phys_port_cnt = 1;
    d
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_query_device(
    c: *mut ibv_context,
    out: *mut ibv_device_attr,
) -> c_int {
    guard(EIO, || {
        // SAFETY: C contract: a live context of ours or NULL.
        let Some(ctx) = (unsafe { Ctx::of(c) }) else {
            return EINVAL;
        };
        if out.is_null() {
            return EINVAL;
        }
        // SAFETY: the caller passes a writable `struct ibv_device_attr`.
        unsafe { out.write(device_attr(ctx)) };
        0
    })
}

fn port_attr(ctx: &Ctx) -> ibv_port_attr {
    ibv_port_attr {
        state: IBV_PORT_ACTIVE,
        max_mtu: IBV_MTU_4096,
        active_mtu: IBV_MTU_4096,
        gid_tbl_len: ctx.gids.len() as c_int,
        port_cap_flags: 0,
        max_msg_sz: 1 << 31,
        bad_pkey_cntr: 0,
        qkey_viol_cntr: 0,
        pkey_tbl_len: 1,
        lid: 0,
        sm_lid: 0,
        lmc: 0,
        max_vl_num: 1,
        sm_sl: 0,
        subnet_timeout: 0,
        init_type_reply: 0,
        // 4X, 25 Gb/s per lane (EDR): a number, the engine's speed is what it is.
        active_width: 2,
        active_speed: 32,
        // LinkUp.
        phys_state: 5,
        link_layer: IBV_LINK_LAYER_ETHERNET,
        flags: 0,
        port_cap_flags2: {
            let _ = ctx;
            0
        },
    }
}

/// `verbs_context::query_port`: what the static-inline `ibv_query_port` calls.
unsafe extern "C" fn query_port_ex(
    c: *mut ibv_context,
    port: u8,
    out: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    guard(EIO, || {
        // SAFETY: C contract: a live context of ours or NULL.
        let Some(ctx) = (unsafe { Ctx::of(c) }) else {
            return EINVAL;
        };
        if port != 1 || out.is_null() {
            return EINVAL;
        }
        let a = port_attr(ctx);
        let n = len.min(size_of::<ibv_port_attr>());
        // SAFETY: the caller's buffer holds `len` bytes (the inline passes its sizeof).
        unsafe {
            std::ptr::copy_nonoverlapping((&a as *const ibv_port_attr).cast::<u8>(), out.cast(), n)
        };
        0
    })
}

/// The exported `ibv_query_port@IBVERBS_1.1` (the inline's fallback, and old binaries): its
/// struct is `ibv_port_attr` without `port_cap_flags2`.
#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_query_port(
    c: *mut ibv_context,
    port: u8,
    out: *mut ibv_port_attr,
) -> c_int {
    // SAFETY: the compat struct is the prefix up to `port_cap_flags2`.
    unsafe { query_port_ex(c, port, out, offset_of!(ibv_port_attr, port_cap_flags2)) }
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_query_gid(
    c: *mut ibv_context,
    port: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    guard(-1, || {
        // SAFETY: C contract: a live context of ours or NULL.
        let Some(ctx) = (unsafe { Ctx::of(c) }) else {
            set_errno(EINVAL);
            return -1;
        };
        let entry = usize::try_from(index).ok().and_then(|i| ctx.gids.get(i));
        let (Some(&(raw, _)), 1, false) = (entry, port, gid.is_null()) else {
            set_errno(EINVAL);
            return -1;
        };
        // SAFETY: the caller passes a writable `union ibv_gid`.
        unsafe { gid.write(ibv_gid { raw }) };
        0
    })
}

/// `IBV_GID_TYPE_SYSFS_IB_ROCE_V1`, `IBV_GID_TYPE_SYSFS_ROCE_V2` (driver.h's
/// `enum ibv_gid_type_sysfs`).
const GID_TYPE_SYSFS_IB_ROCE_V1: c_int = 0;
const GID_TYPE_SYSFS_ROCE_V2: c_int = 1;

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_query_gid_type(
    c: *mut ibv_context,
    port: u8,
    index: u32,
    ty: *mut c_int,
) -> c_int {
    guard(-1, || {
        // SAFETY: C contract: a live context of ours or NULL.
        let Some(ctx) = (unsafe { Ctx::of(c) }) else {
            set_errno(EINVAL);
            return -1;
        };
        let (Some(&(_, t)), 1, false) = (ctx.gids.get(index as usize), port, ty.is_null()) else {
            set_errno(EINVAL);
            return -1;
        };
        let sysfs = if t == IBV_GID_TYPE_ROCE_V2 {
            GID_TYPE_SYSFS_ROCE_V2
        } else {
            GID_TYPE_SYSFS_IB_ROCE_V1
        };
        // SAFETY: the caller passes a writable enum.
        unsafe { ty.write(sysfs) };
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs__ibv_query_gid_ex(
    c: *mut ibv_context,
    port: u32,
    index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    size: usize,
) -> c_int {
    guard(EIO, || {
        // SAFETY: C contract: a live context of ours or NULL.
        let Some(ctx) = (unsafe { Ctx::of(c) }) else {
            return EINVAL;
        };
        if flags != 0 || entry.is_null() || size < size_of::<ibv_gid_entry>() {
            return EINVAL;
        }
        let Some(&(raw, gid_type)) = ctx.gids.get(index as usize).filter(|_| port == 1) else {
            return ENOENT;
        };
        let e = ibv_gid_entry {
            gid: ibv_gid { raw },
            gid_index: index,
            port_num: 1,
            gid_type,
            ndev_ifindex: 0,
        };
        // SAFETY: the caller's buffer holds at least one entry (checked `size`).
        unsafe { entry.write(e) };
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs__ibv_query_gid_table(
    c: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max: usize,
    flags: u32,
    size: usize,
) -> isize {
    guard(-(EIO as isize), || {
        // SAFETY: C contract: a live context of ours or NULL.
        let Some(ctx) = (unsafe { Ctx::of(c) }) else {
            return -(EINVAL as isize);
        };
        let n = ctx.gids.len().min(max);
        if n == 0 || size < size_of::<ibv_gid_entry>() {
            return -(EINVAL as isize);
        }
        for i in 0..n {
            // SAFETY: the caller's array holds `max` entries of `size` bytes (`size` at
            // least ours: checked), and `i < max`; query_gid_ex writes one there.
            let rc = unsafe {
                vrdma_verbs__ibv_query_gid_ex(
                    c,
                    1,
                    i as u32,
                    entries.cast::<u8>().add(i * size).cast(),
                    flags,
                    size,
                )
            };
            if rc != 0 {
                return -(rc as isize);
            }
        }
        n as isize
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_query_pkey(
    c: *mut ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    guard(-1, || {
        // SAFETY: C contract: a live context of ours or NULL.
        if unsafe { Ctx::of(c) }.is_none() || port != 1 || index != 0 || pkey.is_null() {
            set_errno(EINVAL);
            return -1;
        }
        // SAFETY: the caller passes a writable `__be16`.
        unsafe { pkey.write(0xffff) };
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_get_pkey_index(
    c: *mut ibv_context,
    port: u8,
    pkey: u16,
) -> c_int {
    guard(-1, || {
        // SAFETY: C contract.
        if unsafe { Ctx::of(c) }.is_some() && port == 1 && pkey == 0xffff {
            0
        } else {
            set_errno(ENOENT);
            -1
        }
    })
}

/// The backend's QP fatal, CQ overrun and device loss events, as `IBV_EVENT_QP_FATAL`,
/// `IBV_EVENT_CQ_ERR` and `IBV_EVENT_DEVICE_FATAL`. Blocks on `async_fd` unless the program
/// made it non-blocking (then EAGAIN). Events of objects already destroyed are skipped.
#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_get_async_event(
    c: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    guard(-1, || {
        // SAFETY: C contract.
        let Some(ctx) = (unsafe { Ctx::of(c) }) else {
            set_errno(EINVAL);
            return -1;
        };
        if event.is_null() {
            set_errno(EINVAL);
            return -1;
        }
        ctx.watch.want_events();
        loop {
            let mut b = [0u8; 1];
            if let Err(e) = rustix::io::read(&ctx.watch.events.rd, &mut b) {
                set_errno(e.raw_os_error());
                return -1;
            }
            let next = ctx
                .watch
                .events
                .q
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop_front();
            let Some((kind, handle)) = next else {
                continue;
            };
            let lookup = |m: &Mutex<std::collections::HashMap<u32, usize>>| {
                m.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&handle)
                    .copied()
            };
            let ev = match kind {
                vrdma::EventKind::QpFatal => match lookup(&ctx.qps) {
                    Some(p) => ibv_async_event {
                        element: ibv_async_event_element {
                            qp: p as *mut ibv_qp,
                        },
                        event_type: IBV_EVENT_QP_FATAL,
                    },
                    None => continue,
                },
                vrdma::EventKind::CqOverrun => match lookup(&ctx.cqs) {
                    Some(p) => ibv_async_event {
                        element: ibv_async_event_element {
                            cq: p as *mut ibv_cq,
                        },
                        event_type: IBV_EVENT_CQ_ERR,
                    },
                    None => continue,
                },
                // The verbs device's QP and port events (backend.md, "HCA async events").
                vrdma::EventKind::QpCommEstablished
                | vrdma::EventKind::QpLastWqeReached
                | vrdma::EventKind::QpPathMigrated
                | vrdma::EventKind::QpPathMigrationError => match lookup(&ctx.qps) {
                    Some(p) => ibv_async_event {
                        element: ibv_async_event_element {
                            qp: p as *mut ibv_qp,
                        },
                        event_type: match kind {
                            vrdma::EventKind::QpCommEstablished => IBV_EVENT_COMM_EST,
                            vrdma::EventKind::QpLastWqeReached => IBV_EVENT_QP_LAST_WQE_REACHED,
                            vrdma::EventKind::QpPathMigrated => IBV_EVENT_PATH_MIG,
                            _ => IBV_EVENT_PATH_MIG_ERR,
                        },
                    },
                    None => continue,
                },
                vrdma::EventKind::PortActive | vrdma::EventKind::PortError => ibv_async_event {
                    element: ibv_async_event_element { port_num: 1 },
                    event_type: if kind == vrdma::EventKind::PortActive {
                        IBV_EVENT_PORT_ACTIVE
                    } else {
                        IBV_EVENT_PORT_ERR
                    },
                },
                _ => ibv_async_event {
                    element: ibv_async_event_element { port_num: 1 },
                    event_type: IBV_EVENT_DEVICE_FATAL,
                },
            };
            // SAFETY: the caller's event struct.
            unsafe { event.write(ev) };
            return 0;
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_ack_async_event(_event: *mut ibv_async_event) {}

/// `ibv_read_sysfs_file`: the vrdma device has no sysfs directory; other paths are read as
/// libibverbs does.
#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    guard(-1, || {
        if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
            set_errno(EINVAL);
            return -1;
        }
        // SAFETY: NUL-terminated strings from the caller.
        let (d, f) = unsafe { (CStr::from_ptr(dir), CStr::from_ptr(file)) };
        let path = format!("{}/{}", d.to_string_lossy(), f.to_string_lossy());
        let Ok(mut text) = std::fs::read(&path) else {
            set_errno(ENOENT);
            return -1;
        };
        text.truncate(size - 1);
        if text.last() == Some(&b'\n') {
            text.pop();
        }
        // SAFETY: `buf` holds `size` bytes; we write at most size-1 plus the NUL.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), text.len());
            *buf.add(text.len()) = 0;
        }
        text.len() as c_int
    })
}
