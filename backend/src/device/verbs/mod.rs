//! rdma-core's libibverbs, loaded at run time: the foundation of the verbs device (a backend
//! [`Device`](super::Device) on any RDMA device dom0 has — issue 13).
//!
//! # Model
//!
//! * [`VerbsLib`] (`dl`) dlopens `libibverbs.so.1` (or `$VRDMA_LIBIBVERBS`) when first asked
//!   and resolves the exported verbs. Nothing links against rdma-core: a host without it
//!   fails here, with [`VerbsError::LibraryMissing`] naming the packages to install.
//! * Objects are RAII handles, each holding a reference to what it was made from, so they
//!   are destroyed child-first whatever order the owner drops them in:
//!   [`Qp`] → its [`Pd`] and [`Cq`]s; [`Mr`] → [`Pd`]; [`Cq`] → [`CompChannel`] and
//!   [`Context`]; [`Pd`] → [`Context`]; [`Context`] → [`VerbsLib`]. `Context`, `Pd`, `Cq`
//!   and `CompChannel` are shared handles (clone = another reference); `Mr` and `Qp` are
//!   owned. A destroy that fails in `Drop` is logged (the object leaks, never a double free).
//! * The data-path verbs are verbs.h static inlines: [`Qp::post_send`], [`Qp::post_recv`],
//!   [`Cq::poll`] and [`Cq::req_notify`] call `context->ops` exactly as those inlines do
//!   (layout checked by `verbs-abi`'s C test).
//! * libibverbs objects are thread-safe (rdma-core serialises inside the provider), so the
//!   handles are `Send + Sync`.
//!
//! [`probe`] lists the devices and runs a loopback self-test (`vrdmactl verbs-probe`).

mod av;
mod device;
mod dl;
mod events;
#[cfg(test)]
mod fake;
mod keeper;
pub mod probe;
mod relay;

use std::ffi::{c_int, c_void};
use std::os::fd::{BorrowedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

pub use device::{attrs_of, VerbsDevice, LIBRDMACM_ENV, LIBRDMACM_SONAME};
pub use dl::{VerbsLib, LIBIBVERBS_ENV, LIBIBVERBS_SONAME};
pub use verbs_abi::verbs as abi;

use abi::{
    ibv_async_event, ibv_comp_channel, ibv_context, ibv_cq, ibv_device_attr, ibv_gid, ibv_mr,
    ibv_pd, ibv_port_attr, ibv_qp, ibv_qp_attr, ibv_qp_init_attr, ibv_recv_wr, ibv_send_wr, ibv_wc,
};
use dl::{last_errno, rc_error};

/// Errors of the verbs layer. `errno` values from libibverbs are kept as `io::Error`s.
#[derive(Debug, thiserror::Error)]
pub enum VerbsError {
    #[error(
        "cannot load rdma-core's libibverbs ({path}): {reason}; install the Debian packages \
         libibverbs1 and ibverbs-providers (apt-get install libibverbs1 ibverbs-providers)"
    )]
    LibraryMissing { path: String, reason: String },
    #[error(
        "cannot load rdma-core's librdmacm ({path}): {reason}; install the Debian package \
         librdmacm1 (apt-get install librdmacm1)"
    )]
    RdmacmMissing { path: String, reason: String },
    #[error("{path} has no symbol {symbol} (rdma-core 44 or later is needed): {reason}")]
    Symbol {
        path: String,
        symbol: &'static str,
        reason: String,
    },
    /// `cause` is in the message (not a `source()`, so an error chain does not print it
    /// twice).
    #[error("{op} failed: {cause}")]
    Call {
        op: &'static str,
        cause: std::io::Error,
    },
    #[error("no RDMA device named {name:?} (libibverbs sees: {seen})")]
    NoSuchDevice { name: String, seen: String },
    /// `ibv_poll_cq` returned a negative value: providers return -1 (or their own negative
    /// codes), not an errno, so the value is kept as it is.
    #[error("ibv_poll_cq failed (the provider returned {0})")]
    PollFailed(i32),
    #[error("the device's provider leaves ibv_context_ops.{0} empty")]
    MissingOp(&'static str),
    #[error("{0}")]
    Invalid(String),
}

impl VerbsError {
    fn call(op: &'static str, source: std::io::Error) -> VerbsError {
        VerbsError::Call { op, cause: source }
    }

    /// The errno of a failed libibverbs call.
    pub fn errno(&self) -> Option<i32> {
        match self {
            VerbsError::Call { cause, .. } => cause.raw_os_error(),
            _ => None,
        }
    }
}

/// One device as `ibv_get_device_list` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceEntry {
    /// Kernel device name (`rxe0`, `mlx5_0`).
    pub name: String,
    /// `ibv_node_type` (`IBV_NODE_CA`, `IBV_NODE_RNIC`, …).
    pub node_type: i32,
    /// `ibv_transport_type` (`IBV_TRANSPORT_IB` also for RoCE, `IBV_TRANSPORT_IWARP`).
    pub transport_type: i32,
}

/// What `ibv_get_device_list` returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceList {
    pub devices: Vec<DeviceEntry>,
    /// Why the list is empty when libibverbs said more than "none" (it fails with ENOSYS
    /// when the kernel has no RDMA support loaded: no `ib_uverbs`).
    pub empty_reason: Option<String>,
}

fn c_name(raw: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = raw
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

impl VerbsLib {
    /// The devices libibverbs sees. A kernel without RDMA support (ENOSYS) is an empty list
    /// with its reason, not an error.
    pub fn devices(&self) -> Result<DeviceList, VerbsError> {
        let mut n: c_int = 0;
        // SAFETY: a valid out-pointer; the list is freed below.
        let list = unsafe { (self.fns().get_device_list)(&mut n) };
        if list.is_null() {
            let e = last_errno();
            if e.raw_os_error() == Some(libc_enosys()) {
                return Ok(DeviceList {
                    devices: Vec::new(),
                    empty_reason: Some(format!(
                        "ibv_get_device_list: {e} (the kernel has no RDMA support loaded: \
                         ib_uverbs and a device driver such as rdma_rxe or mlx5_ib)"
                    )),
                });
            }
            return Err(VerbsError::call("ibv_get_device_list", e));
        }
        let mut devices = Vec::new();
        for i in 0..usize::try_from(n).unwrap_or(0) {
            // SAFETY: the list has `n` valid device pointers (and a NULL after them).
            let dev = unsafe { *list.add(i) };
            if dev.is_null() {
                break;
            }
            // SAFETY: a device of the list, valid until the list is freed.
            let d = unsafe { &*dev };
            devices.push(DeviceEntry {
                name: c_name(&d.name),
                node_type: d.node_type,
                transport_type: d.transport_type,
            });
        }
        // SAFETY: the list came from ibv_get_device_list and is freed once.
        unsafe { (self.fns().free_device_list)(list) };
        Ok(DeviceList {
            devices,
            empty_reason: None,
        })
    }

    /// Opens the device called `name`.
    pub fn open_device(&self, name: &str) -> Result<Context, VerbsError> {
        let mut n: c_int = 0;
        // SAFETY: as in `devices`.
        let list = unsafe { (self.fns().get_device_list)(&mut n) };
        if list.is_null() {
            let e = last_errno();
            return Err(VerbsError::NoSuchDevice {
                name: name.to_owned(),
                seen: format!("no devices ({e})"),
            });
        }
        let mut seen = Vec::new();
        let mut found = std::ptr::null_mut();
        for i in 0..usize::try_from(n).unwrap_or(0) {
            // SAFETY: as in `devices`.
            let dev = unsafe { *list.add(i) };
            if dev.is_null() {
                break;
            }
            // SAFETY: as in `devices`.
            let dname = c_name(unsafe { &(*dev).name });
            if dname == name {
                found = dev;
                break;
            }
            seen.push(dname);
        }
        let ctx = if found.is_null() {
            None
        } else {
            // SAFETY: a device of the live list. An opened context stays valid after the list
            // is freed (libibverbs keeps the device referenced while it is open).
            Some(unsafe { (self.fns().open_device)(found) })
        };
        let err = last_errno();
        // SAFETY: freed once, after the open.
        unsafe { (self.fns().free_device_list)(list) };
        match ctx {
            None => Err(VerbsError::NoSuchDevice {
                name: name.to_owned(),
                seen: if seen.is_empty() {
                    "no devices".into()
                } else {
                    seen.join(", ")
                },
            }),
            Some(p) => match NonNull::new(p) {
                None => Err(VerbsError::call("ibv_open_device", err)),
                Some(ctx) => Ok(Context {
                    inner: Arc::new(ContextInner {
                        lib: self.clone(),
                        ctx,
                        name: name.to_owned(),
                    }),
                }),
            },
        }
    }
}

fn libc_enosys() -> i32 {
    // ENOSYS is 38 on every Linux architecture.
    38
}

struct ContextInner {
    lib: VerbsLib,
    ctx: NonNull<ibv_context>,
    name: String,
}

// SAFETY: an ibv_context is usable from any thread (libibverbs locks internally); the handle
// only hands out the pointer to libibverbs calls.
unsafe impl Send for ContextInner {}
// SAFETY: as above.
unsafe impl Sync for ContextInner {}

impl Drop for ContextInner {
    fn drop(&mut self) {
        // SAFETY: the context is open and every child object (which holds an Arc of this)
        // is gone.
        let rc = unsafe { (self.lib.fns().close_device)(self.ctx.as_ptr()) };
        if rc != 0 {
            tracing::error!(device = %self.name, err = %rc_error(rc), "ibv_close_device failed");
        }
    }
}

/// An open device (`ibv_context`). Clone = another reference; closed with the last one.
#[derive(Clone)]
pub struct Context {
    inner: Arc<ContextInner>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.inner.name)
            .finish()
    }
}

impl Context {
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    pub fn lib(&self) -> &VerbsLib {
        &self.inner.lib
    }

    fn raw(&self) -> *mut ibv_context {
        self.inner.ctx.as_ptr()
    }

    /// The device's `ibv_transport_type` (`IBV_TRANSPORT_IB` also for RoCE).
    pub fn transport_type(&self) -> i32 {
        // SAFETY: a live context's `device` points at the ibv_device libibverbs keeps while
        // the context is open; reading a plain int field.
        unsafe { (*(*self.raw()).device).transport_type }
    }

    /// The context's uverbs file descriptor (the verbs' commands go through it).
    pub fn cmd_fd(&self) -> RawFd {
        // SAFETY: a live context; reading a plain int field.
        unsafe { (*self.raw()).cmd_fd }
    }

    /// The file descriptor of the context's async events (`ibv_get_async_event` reads it).
    pub fn async_fd(&self) -> RawFd {
        // SAFETY: a live context; reading a plain int field.
        unsafe { (*self.raw()).async_fd }
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> Result<ibv_device_attr, VerbsError> {
        let mut attr = ibv_device_attr::default();
        // SAFETY: a live context and a valid out-struct of the header's layout.
        let rc = unsafe { (self.lib().fns().query_device)(self.raw(), &mut attr) };
        if rc != 0 {
            return Err(VerbsError::call("ibv_query_device", rc_error(rc)));
        }
        Ok(attr)
    }

    /// `ibv_query_port` (the exported compat entry point; `flags` and `port_cap_flags2` read
    /// as 0).
    pub fn query_port(&self, port: u8) -> Result<ibv_port_attr, VerbsError> {
        let mut attr = ibv_port_attr::default();
        // SAFETY: a live context; the out-struct is zeroed and at least as large as the
        // `_compat_ibv_port_attr` the symbol fills.
        let rc = unsafe { (self.lib().fns().query_port)(self.raw(), port, &mut attr) };
        if rc != 0 {
            return Err(VerbsError::call("ibv_query_port", rc_error(rc)));
        }
        Ok(attr)
    }

    /// `ibv_query_gid`: entry `index` of the port's GID table.
    pub fn query_gid(&self, port: u8, index: i32) -> Result<ibv_gid, VerbsError> {
        let mut gid = ibv_gid::default();
        // SAFETY: a live context and a valid 16-byte out-union.
        let rc = unsafe { (self.lib().fns().query_gid)(self.raw(), port, index, &mut gid) };
        if rc != 0 {
            return Err(VerbsError::call("ibv_query_gid", rc_error(rc)));
        }
        Ok(gid)
    }

    /// The type (`IBV_GID_TYPE_IB`, `_ROCE_V1`, `_ROCE_V2`) of entry `index` of the port's
    /// GID table: `_ibv_query_gid_ex` when the library has it, else the kernel's
    /// `/sys/class/infiniband/<dev>/ports/<port>/gid_attrs/types/<index>`; `None` when
    /// neither answers.
    pub fn gid_type(&self, port: u8, index: i32) -> Option<u32> {
        let index_u = u32::try_from(index).ok()?;
        if let Some(f) = self.lib().fns().query_gid_ex {
            let mut e = abi::ibv_gid_entry::default();
            // SAFETY: a live context and a valid out-struct of the size passed.
            let rc = unsafe {
                f(
                    self.raw(),
                    u32::from(port),
                    index_u,
                    &mut e,
                    0,
                    std::mem::size_of::<abi::ibv_gid_entry>(),
                )
            };
            if rc == 0 {
                return Some(e.gid_type);
            }
        }
        let path = format!(
            "/sys/class/infiniband/{}/ports/{port}/gid_attrs/types/{index}",
            self.name()
        );
        gid_type_of_sysfs(&std::fs::read_to_string(path).ok()?)
    }

    /// The port's non-zero GIDs (its first 256 entries) with their types: all
    /// `IBV_GID_TYPE_IB` on an InfiniBand port.
    pub fn gid_table(&self, port: u8, pattr: &ibv_port_attr) -> Vec<PortGid> {
        let ib = pattr.link_layer != abi::IBV_LINK_LAYER_ETHERNET;
        (0..pattr.gid_tbl_len.clamp(0, 256))
            .filter_map(|index| {
                let gid = self.query_gid(port, index).ok()?.raw();
                (gid != [0; 16]).then(|| PortGid {
                    index,
                    gid,
                    ty: if ib {
                        Some(abi::IBV_GID_TYPE_IB)
                    } else {
                        self.gid_type(port, index)
                    },
                })
            })
            .collect()
    }

    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&self) -> Result<Pd, VerbsError> {
        // SAFETY: a live context.
        let p = unsafe { (self.lib().fns().alloc_pd)(self.raw()) };
        let pd = NonNull::new(p).ok_or_else(|| VerbsError::call("ibv_alloc_pd", last_errno()))?;
        Ok(Pd {
            inner: Arc::new(PdInner {
                ctx: self.clone(),
                pd,
            }),
        })
    }

    /// `ibv_create_comp_channel`.
    pub fn create_comp_channel(&self) -> Result<CompChannel, VerbsError> {
        // SAFETY: a live context.
        let p = unsafe { (self.lib().fns().create_comp_channel)(self.raw()) };
        let ch = NonNull::new(p)
            .ok_or_else(|| VerbsError::call("ibv_create_comp_channel", last_errno()))?;
        Ok(CompChannel {
            inner: Arc::new(ChannelInner {
                ctx: self.clone(),
                ch,
            }),
        })
    }

    /// `ibv_create_cq` with at least `cqe` entries, reporting to `channel` if given.
    pub fn create_cq(&self, cqe: i32, channel: Option<&CompChannel>) -> Result<Cq, VerbsError> {
        let ch = channel.map_or(std::ptr::null_mut(), |c| c.raw());
        // SAFETY: a live context; the channel (if any) belongs to a live context and is kept
        // alive by the CQ below.
        let p =
            unsafe { (self.lib().fns().create_cq)(self.raw(), cqe, std::ptr::null_mut(), ch, 0) };
        let cq = NonNull::new(p).ok_or_else(|| VerbsError::call("ibv_create_cq", last_errno()))?;
        Ok(Cq {
            inner: Arc::new(CqInner {
                ctx: self.clone(),
                channel: channel.cloned(),
                cq,
                unacked: AtomicU32::new(0),
            }),
        })
    }

    /// The next asynchronous event of the device, copied out (its QP's number, its CQ's
    /// kernel handle) and acknowledged before returning — `ibv_destroy_qp`/`_cq` wait for
    /// their events to be acknowledged, so nothing is held. `None` when there is none (the
    /// async fd must have been made non-blocking with [`Context::set_async_nonblocking`]).
    pub fn next_async_event(&self) -> Result<Option<AsyncEvent>, VerbsError> {
        let mut ev = ibv_async_event::default();
        // SAFETY: a live context and a valid out-struct.
        let rc = unsafe { (self.lib().fns().get_async_event)(self.raw(), &mut ev) };
        if rc != 0 {
            let e = rc_error(rc);
            if matches!(e.kind(), std::io::ErrorKind::WouldBlock) {
                return Ok(None);
            }
            return Err(VerbsError::call("ibv_get_async_event", e));
        }
        let kind = ev.event_type;
        // SAFETY: the union member the event type names (ibverbs' documented pairing); the
        // object is live until the event is acknowledged below.
        let element = unsafe {
            match AsyncElement::class_of(kind) {
                AsyncClass::Qp if !ev.element.qp.is_null() => {
                    AsyncElement::Qp((*ev.element.qp).qp_num)
                }
                AsyncClass::Cq if !ev.element.cq.is_null() => {
                    AsyncElement::Cq((*ev.element.cq).handle)
                }
                AsyncClass::Port => AsyncElement::Port(ev.element.port_num),
                AsyncClass::Device => AsyncElement::Device,
                _ => AsyncElement::Other,
            }
        };
        // SAFETY: the event just returned by ibv_get_async_event, acknowledged once.
        unsafe { (self.lib().fns().ack_async_event)(&mut ev) };
        Ok(Some(AsyncEvent { kind, element }))
    }

    /// Makes the async-event fd non-blocking (for [`Context::next_async_event`]).
    pub fn set_async_nonblocking(&self) -> Result<(), VerbsError> {
        // SAFETY: the context's async fd, open as long as the context.
        let fd = unsafe { BorrowedFd::borrow_raw(self.async_fd()) };
        rustix::io::ioctl_fionbio(fd, true)
            .map_err(|e| VerbsError::call("ioctl(FIONBIO) on the async event fd", e.into()))
    }

    /// `ibv_get_async_event` (blocks until one arrives unless the fd was made non-blocking):
    /// the event type, acknowledged before returning.
    pub fn get_async_event(&self) -> Result<u32, VerbsError> {
        let mut ev = ibv_async_event::default();
        // SAFETY: a live context and a valid out-struct.
        let rc = unsafe { (self.lib().fns().get_async_event)(self.raw(), &mut ev) };
        if rc != 0 {
            return Err(VerbsError::call("ibv_get_async_event", rc_error(rc)));
        }
        let kind = ev.event_type;
        // SAFETY: the event just returned by ibv_get_async_event, acknowledged once.
        unsafe { (self.lib().fns().ack_async_event)(&mut ev) };
        Ok(kind)
    }
}

struct PdInner {
    ctx: Context,
    pd: NonNull<ibv_pd>,
}

// SAFETY: see ContextInner.
unsafe impl Send for PdInner {}
// SAFETY: see ContextInner.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: a live PD whose MRs and QPs (which hold an Arc of this) are gone.
        let rc = unsafe { (self.ctx.lib().fns().dealloc_pd)(self.pd.as_ptr()) };
        if rc != 0 {
            tracing::error!(device = %self.ctx.name(), err = %rc_error(rc), "ibv_dealloc_pd failed");
        }
    }
}

/// A protection domain. Clone = another reference.
#[derive(Clone)]
pub struct Pd {
    inner: Arc<PdInner>,
}

impl Pd {
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    fn raw(&self) -> *mut ibv_pd {
        self.inner.pd.as_ptr()
    }

    /// `ibv_reg_mr`: registers `len` bytes at `addr` with `access` (`IBV_ACCESS_*`); the
    /// region's iova is its address.
    ///
    /// # Safety
    /// The memory stays mapped (and is not reused for anything the device must not touch)
    /// until the returned [`Mr`] is dropped: the device reads and writes it behind Rust's
    /// back, so the caller accesses it only through raw pointers or volatile copies.
    pub unsafe fn reg_mr(&self, addr: *mut u8, len: usize, access: u32) -> Result<Mr, VerbsError> {
        let access = c_int::try_from(access)
            .map_err(|_| VerbsError::Invalid(format!("access flags {access:#x}")))?;
        // SAFETY: a live PD; the memory's lifetime is the caller's promise.
        let p =
            unsafe { (self.context().lib().fns().reg_mr)(self.raw(), addr.cast(), len, access) };
        self.wrap_mr(p, "ibv_reg_mr")
    }

    /// `ibv_reg_mr_iova2`: as [`Pd::reg_mr`], with remote addresses in `iova`'s space (a
    /// guest MR keeps the guest's iova).
    ///
    /// # Safety
    /// As [`Pd::reg_mr`].
    pub unsafe fn reg_mr_iova(
        &self,
        addr: *mut u8,
        len: usize,
        iova: u64,
        access: u32,
    ) -> Result<Mr, VerbsError> {
        // SAFETY: a live PD; the memory's lifetime is the caller's promise.
        let p = unsafe {
            (self.context().lib().fns().reg_mr_iova2)(self.raw(), addr.cast(), len, iova, access)
        };
        self.wrap_mr(p, "ibv_reg_mr_iova2")
    }

    fn wrap_mr(&self, p: *mut ibv_mr, op: &'static str) -> Result<Mr, VerbsError> {
        let mr = NonNull::new(p).ok_or_else(|| VerbsError::call(op, last_errno()))?;
        Ok(Mr {
            pd: self.clone(),
            mr,
        })
    }

    /// `ibv_create_qp` on this PD with the given CQs; `attr.send_cq`/`recv_cq` are set from
    /// them.
    pub fn create_qp(
        &self,
        send_cq: &Cq,
        recv_cq: &Cq,
        mut attr: ibv_qp_init_attr,
    ) -> Result<Qp, VerbsError> {
        if !Arc::ptr_eq(&send_cq.inner.ctx.inner, &self.inner.ctx.inner)
            || !Arc::ptr_eq(&recv_cq.inner.ctx.inner, &self.inner.ctx.inner)
        {
            return Err(VerbsError::Invalid(
                "the QP's CQs belong to another device context".into(),
            ));
        }
        attr.send_cq = send_cq.raw();
        attr.recv_cq = recv_cq.raw();
        attr.srq = std::ptr::null_mut();
        // SAFETY: a live PD and live CQs of the same context, kept alive by the Qp.
        let p = unsafe { (self.context().lib().fns().create_qp)(self.raw(), &mut attr) };
        let qp = NonNull::new(p).ok_or_else(|| VerbsError::call("ibv_create_qp", last_errno()))?;
        Ok(Qp {
            pd: self.clone(),
            send_cq: send_cq.clone(),
            recv_cq: recv_cq.clone(),
            qp,
            cap: attr.cap,
        })
    }
}

/// A registered memory region. Deregistered on drop (before its PD can go).
pub struct Mr {
    pd: Pd,
    mr: NonNull<ibv_mr>,
}

// SAFETY: see ContextInner.
unsafe impl Send for Mr {}
// SAFETY: see ContextInner.
unsafe impl Sync for Mr {}

impl Mr {
    fn get(&self) -> &ibv_mr {
        // SAFETY: a live MR; libibverbs does not change these fields after registration.
        unsafe { self.mr.as_ref() }
    }

    pub fn lkey(&self) -> u32 {
        self.get().lkey
    }

    pub fn rkey(&self) -> u32 {
        self.get().rkey
    }

    /// The kernel's handle of the registration (uverbs).
    pub fn handle(&self) -> u32 {
        self.get().handle
    }

    pub fn addr(&self) -> u64 {
        self.get().addr as u64
    }

    pub fn len(&self) -> usize {
        self.get().length
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn pd(&self) -> &Pd {
        &self.pd
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: a live MR, deregistered once.
        let rc = unsafe { (self.pd.context().lib().fns().dereg_mr)(self.mr.as_ptr()) };
        if rc != 0 {
            tracing::error!(err = %rc_error(rc), "ibv_dereg_mr failed");
        }
    }
}

struct ChannelInner {
    ctx: Context,
    ch: NonNull<ibv_comp_channel>,
}

// SAFETY: see ContextInner.
unsafe impl Send for ChannelInner {}
// SAFETY: see ContextInner.
unsafe impl Sync for ChannelInner {}

impl Drop for ChannelInner {
    fn drop(&mut self) {
        // SAFETY: a live channel whose CQs (which hold an Arc of this) are gone.
        let rc = unsafe { (self.ctx.lib().fns().destroy_comp_channel)(self.ch.as_ptr()) };
        if rc != 0 {
            tracing::error!(err = %rc_error(rc), "ibv_destroy_comp_channel failed");
        }
    }
}

/// A completion channel (`ibv_comp_channel`): its fd becomes readable when an armed CQ gets
/// a completion.
#[derive(Clone)]
pub struct CompChannel {
    inner: Arc<ChannelInner>,
}

impl CompChannel {
    fn raw(&self) -> *mut ibv_comp_channel {
        self.inner.ch.as_ptr()
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the channel's fd stays open as long as the channel, which `self` keeps.
        unsafe { BorrowedFd::borrow_raw((*self.raw()).fd) }
    }

    /// `ibv_get_cq_event` (blocks until an armed CQ of this channel completes, unless the fd
    /// was made non-blocking): which of `cqs` fired. The event is counted on that CQ and
    /// acknowledged when it is destroyed, or by [`Cq::ack_events`].
    pub fn get_cq_event<'a>(&self, cqs: &[&'a Cq]) -> Result<&'a Cq, VerbsError> {
        let mut cq: *mut ibv_cq = std::ptr::null_mut();
        let mut cq_ctx: *mut c_void = std::ptr::null_mut();
        // SAFETY: a live channel and valid out-pointers.
        let rc =
            unsafe { (self.inner.ctx.lib().fns().get_cq_event)(self.raw(), &mut cq, &mut cq_ctx) };
        if rc != 0 {
            return Err(VerbsError::call("ibv_get_cq_event", rc_error(rc)));
        }
        let Some(hit) = cqs.iter().find(|c| c.raw() == cq) else {
            return Err(VerbsError::Invalid(
                "ibv_get_cq_event returned a CQ the caller did not name".into(),
            ));
        };
        hit.inner.unacked.fetch_add(1, Ordering::Relaxed);
        Ok(hit)
    }
}

/// An asynchronous event of the device ([`Context::next_async_event`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    /// `enum ibv_event_type`.
    pub kind: u32,
    pub element: AsyncElement,
}

/// What an asynchronous event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncElement {
    /// A QP, by number.
    Qp(u32),
    /// A CQ, by kernel handle ([`Cq::handle`]).
    Cq(u32),
    Port(c_int),
    Device,
    /// An SRQ or WQ (vrdma creates none), or an event type this code does not know.
    Other,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AsyncClass {
    Qp,
    Cq,
    Port,
    Device,
    Other,
}

impl AsyncElement {
    /// Which member of `ibv_async_event.element` an event type uses (verbs.h's comments).
    fn class_of(kind: u32) -> AsyncClass {
        use abi::*;
        match kind {
            IBV_EVENT_CQ_ERR => AsyncClass::Cq,
            IBV_EVENT_QP_FATAL
            | IBV_EVENT_QP_REQ_ERR
            | IBV_EVENT_QP_ACCESS_ERR
            | IBV_EVENT_COMM_EST
            | IBV_EVENT_SQ_DRAINED
            | IBV_EVENT_PATH_MIG
            | IBV_EVENT_PATH_MIG_ERR
            | IBV_EVENT_QP_LAST_WQE_REACHED => AsyncClass::Qp,
            IBV_EVENT_PORT_ACTIVE
            | IBV_EVENT_PORT_ERR
            | IBV_EVENT_LID_CHANGE
            | IBV_EVENT_PKEY_CHANGE
            | IBV_EVENT_SM_CHANGE
            | IBV_EVENT_CLIENT_REREGISTER
            | IBV_EVENT_GID_CHANGE => AsyncClass::Port,
            IBV_EVENT_DEVICE_FATAL => AsyncClass::Device,
            _ => AsyncClass::Other,
        }
    }
}

struct CqInner {
    ctx: Context,
    /// Kept so the channel outlives the CQ (fields drop after `Drop::drop`).
    #[allow(dead_code)]
    channel: Option<CompChannel>,
    cq: NonNull<ibv_cq>,
    unacked: AtomicU32,
}

// SAFETY: see ContextInner.
unsafe impl Send for CqInner {}
// SAFETY: see ContextInner.
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        let fns = self.ctx.lib().fns();
        let n = *self.unacked.get_mut();
        if n > 0 {
            // SAFETY: a live CQ; acknowledges events it received (destroy waits for them).
            unsafe { (fns.ack_cq_events)(self.cq.as_ptr(), n) };
        }
        // SAFETY: a live CQ whose QPs (which hold an Arc of this) are gone.
        let rc = unsafe { (fns.destroy_cq)(self.cq.as_ptr()) };
        if rc != 0 {
            tracing::error!(err = %rc_error(rc), "ibv_destroy_cq failed");
        }
    }
}

/// A completion queue. Clone = another reference.
#[derive(Clone)]
pub struct Cq {
    inner: Arc<CqInner>,
}

impl Cq {
    fn raw(&self) -> *mut ibv_cq {
        self.inner.cq.as_ptr()
    }

    /// The CQ's kernel handle (what [`AsyncElement::Cq`] names).
    pub fn handle(&self) -> u32 {
        // SAFETY: a live CQ; a plain integer field.
        unsafe { (*self.raw()).handle }
    }

    /// The number of entries the device gave the CQ (≥ what was asked).
    pub fn capacity(&self) -> i32 {
        // SAFETY: a live CQ; a plain int field.
        unsafe { (*self.raw()).cqe }
    }

    /// `ibv_poll_cq` (through `context->ops.poll_cq`): fills `wc` from the front, returns how
    /// many.
    pub fn poll(&self, wc: &mut [ibv_wc]) -> Result<usize, VerbsError> {
        // SAFETY: a live CQ of a live context (both kept by `self`).
        unsafe { dl::poll_cq_raw(self.raw(), wc) }
    }

    /// `ibv_req_notify_cq` (through `context->ops.req_notify_cq`).
    pub fn req_notify(&self, solicited_only: bool) -> Result<(), VerbsError> {
        // SAFETY: as in `poll`.
        unsafe { dl::req_notify_cq_raw(self.raw(), solicited_only) }
    }

    /// Acknowledges the completion events received so far (`ibv_ack_cq_events`).
    pub fn ack_events(&self) {
        let n = self.inner.unacked.swap(0, Ordering::Relaxed);
        if n > 0 {
            // SAFETY: a live CQ; `n` events were received and not yet acknowledged.
            unsafe { (self.inner.ctx.lib().fns().ack_cq_events)(self.raw(), n) };
        }
    }
}

/// A queue pair. Destroyed on drop, before its CQs and PD.
pub struct Qp {
    pd: Pd,
    send_cq: Cq,
    recv_cq: Cq,
    qp: NonNull<ibv_qp>,
    cap: abi::ibv_qp_cap,
}

// SAFETY: see ContextInner.
unsafe impl Send for Qp {}
// SAFETY: see ContextInner.
unsafe impl Sync for Qp {}

impl Qp {
    fn raw(&self) -> *mut ibv_qp {
        self.qp.as_ptr()
    }

    pub fn qp_num(&self) -> u32 {
        // SAFETY: a live QP; a plain field set at creation.
        unsafe { (*self.raw()).qp_num }
    }

    /// The capabilities the device granted at creation.
    pub fn cap(&self) -> abi::ibv_qp_cap {
        self.cap
    }

    pub fn pd(&self) -> &Pd {
        &self.pd
    }

    pub fn send_cq(&self) -> &Cq {
        &self.send_cq
    }

    pub fn recv_cq(&self) -> &Cq {
        &self.recv_cq
    }

    /// `ibv_modify_qp` with the attributes `mask` (`IBV_QP_*`) names.
    pub fn modify(&self, attr: &ibv_qp_attr, mask: u32) -> Result<(), VerbsError> {
        let mut a = *attr;
        let mask =
            c_int::try_from(mask).map_err(|_| VerbsError::Invalid(format!("mask {mask:#x}")))?;
        // SAFETY: a live QP and a valid attribute struct (copied; libibverbs may write it).
        let rc = unsafe { (self.pd.context().lib().fns().modify_qp)(self.raw(), &mut a, mask) };
        if rc != 0 {
            return Err(VerbsError::call("ibv_modify_qp", rc_error(rc)));
        }
        Ok(())
    }

    /// `ibv_query_qp` for the attributes in `mask`.
    pub fn query(&self, mask: u32) -> Result<(ibv_qp_attr, ibv_qp_init_attr), VerbsError> {
        let mut a = ibv_qp_attr::default();
        let mut init = ibv_qp_init_attr::default();
        let mask =
            c_int::try_from(mask).map_err(|_| VerbsError::Invalid(format!("mask {mask:#x}")))?;
        // SAFETY: a live QP and valid out-structs.
        let rc = unsafe {
            (self.pd.context().lib().fns().query_qp)(self.raw(), &mut a, mask, &mut init)
        };
        if rc != 0 {
            return Err(VerbsError::call("ibv_query_qp", rc_error(rc)));
        }
        Ok((a, init))
    }

    /// `ibv_post_send` (through `context->ops.post_send`) of a chain of work requests. On
    /// error, the index of the first request not posted comes with it.
    ///
    /// # Safety
    /// `wr` heads a NULL-terminated chain whose `sg_list`s are valid for the call; local
    /// addresses lie in MRs of this QP's PD (the device checks lkeys and bounds, but the
    /// memory behind a valid lkey is the registrant's promise, see [`Pd::reg_mr`]).
    pub unsafe fn post_send(&self, wr: &mut ibv_send_wr) -> Result<(), (usize, VerbsError)> {
        // SAFETY: a live QP (kept by `self`) and the caller's valid chain.
        unsafe { dl::post_send_raw(self.raw(), wr) }
    }

    /// `ibv_post_recv` (through `context->ops.post_recv`).
    ///
    /// # Safety
    /// As [`Qp::post_send`].
    pub unsafe fn post_recv(&self, wr: &mut ibv_recv_wr) -> Result<(), (usize, VerbsError)> {
        // SAFETY: a live QP (kept by `self`) and the caller's valid chain.
        unsafe { dl::post_recv_raw(self.raw(), wr) }
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: a live QP, destroyed once; its CQs and PD are still held by `self`.
        let rc = unsafe { (self.pd.context().lib().fns().destroy_qp)(self.raw()) };
        if rc != 0 {
            tracing::error!(err = %rc_error(rc), "ibv_destroy_qp failed");
        }
    }
}

/// One non-zero entry of a port's GID table ([`Context::gid_table`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortGid {
    pub index: i32,
    pub gid: [u8; 16],
    /// `IBV_GID_TYPE_*`; `None` when the type could not be read.
    pub ty: Option<u32>,
}

/// The type a sysfs `gid_attrs/types/<index>` file names: `RoCE v2`, or `IB/RoCE v1` (RoCE
/// v1 on an Ethernet port; [`Context::gid_table`] types an InfiniBand port's GIDs itself).
pub(crate) fn gid_type_of_sysfs(text: &str) -> Option<u32> {
    match text.trim() {
        "RoCE v2" => Some(abi::IBV_GID_TYPE_ROCE_V2),
        "IB/RoCE v1" => Some(abi::IBV_GID_TYPE_ROCE_V1),
        _ => None,
    }
}

/// A GID as the usual colon-separated hex (`fe80:0000:…`).
pub fn gid_string(gid: &ibv_gid) -> String {
    let r = gid.raw();
    r.chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":")
}

/// A C string field of a verbs structure (`fw_ver`).
pub fn c_string(raw: &[std::ffi::c_char]) -> String {
    c_name(raw)
}

#[cfg(test)]
mod tests;
