//! A channel to the backend (`docs/split-driver.md`): the XenStore handshake that creates it,
//! the control ring and event channel it consists of, the doorbell and event-ring pages the
//! backend grants on `Init`, and the polite close.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shared_ring::abi::control::{DeviceAttrs, Reply, Request};
use shared_ring::abi::event::{EventRepr, EVENT_LEN};
use shared_ring::abi::page_dir::{PageDirWalker, PageList};
use shared_ring::abi::xenstore::{
    channel_path, ChannelKey, DeviceKey, XenbusState, CHANNEL_DIR, MODE_BYPASS, MODE_MEDIATED,
};
use shared_ring::doorbell::DoorbellPage;
use shared_ring::queue::Consumer;
use shared_ring::{
    event_ring, ControlFrontRing, SharedRegion, SharedWord, PAGE_SIZE, PROTOCOL_VERSION,
};
use xen_platform::{Access, DomId, Platform, UnmapNotify};
use xenstore_proto::client::{XenbusStore, XenbusStoreExt};

use crate::control::Control;
use crate::error::{Error, Result};
use crate::signal::{EventHub, Signal};
use crate::AsyncEvent;

/// xenbus states (`io/xenbus.h`) as the numbers the waits below compare.
pub(crate) mod state {
    use shared_ring::abi::xenstore::XenbusState;

    pub const INIT_WAIT: u32 = XenbusState::InitWait as u32;
    pub const INITIALISED: u32 = XenbusState::Initialised as u32;
    pub const CONNECTED: u32 = XenbusState::Connected as u32;
    pub const CLOSING: u32 = XenbusState::Closing as u32;
    pub const CLOSED: u32 = XenbusState::Closed as u32;
}

/// Doorbell pages a channel may map (the backend's limit is the same).
const MAX_DOORBELL_PAGES: usize = 1024;

/// Offset of the alive byte in the control-ring page (the ring header's private area).
pub(crate) const ALIVE_BYTE: usize = 16;

/// Offset of the backend's alive byte in the control-ring page (the first of `io/ring.h`'s
/// pad bytes): the backend sets it to 1 when it maps the ring, with an unmap-notify that
/// clears it and signals the event channel when its mapping goes (its process died).
pub(crate) const BACKEND_ALIVE_BYTE: usize = 20;

/// A nonce naming one channel instance (`channel/<n>/nonce`): unique among this domain's
/// channels, so the backend's answer to an earlier channel at the same index is never taken
/// for the answer to this one.
fn fresh_nonce() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{:x}.{now:x}.{n:x}", std::process::id())
}

/// Whether the backend's alive byte is set, given the control-ring page's word that holds it
/// (at [`BACKEND_ALIVE_BYTE`], resolved once: one load, no bounds check per call).
#[inline]
fn backend_alive(alive: &SharedWord) -> bool {
    alive.load(Ordering::Acquire).to_le_bytes()[0] != 0
}

/// What the caller asked of the channel.
pub(crate) struct ChannelConfig {
    pub devid: u32,
    pub mode: crate::Mode,
    pub timeout: Duration,
    pub close_timeout: Duration,
}

/// Limits the backend published for the device (absent ones are `None`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PublishedLimits {
    pub max_inline: Option<u32>,
    pub max_sge: Option<u32>,
}

/// An open channel.
pub(crate) struct Channel {
    pub store: Arc<dyn XenbusStore>,
    pub platform: Platform,
    pub domid: DomId,
    pub backend: DomId,
    pub devid: u32,
    pub index: u32,
    pub front_chan: String,
    pub back_chan: String,
    pub backend_addr: [u8; 16],
    pub limits: PublishedLimits,
    pub hub: EventHub,
    pub control: Control,
    /// Doorbell page 0 (the `Init` page, with the engine's sleep word).
    pub doorbell: DoorbellPage,
    /// Every doorbell page mapped so far, by page number (slot / `slots_per_page`).
    doorbell_pages: Mutex<Vec<Option<DoorbellPage>>>,
    slots_per_page: u32,
    events: Mutex<Consumer<EVENT_LEN>>,
    pending: Mutex<Vec<AsyncEvent>>,
    lost: AtomicBool,
    lost_reason: Mutex<Option<String>>,
    close_timeout: Duration,
    // Kept mapped until the channel is closed: the control ring (with the alive byte and its
    // unmap-notify) and the backend's event-ring page.
    _ring_page: SharedRegion,
    _event_page: SharedRegion,
    // The words an empty bypass poll reads, resolved (bounds- and alignment-checked) once:
    // the backend's alive word in the control ring, the event ring's two indexes.
    alive: SharedWord,
    event_prod: SharedWord,
    event_cons: SharedWord,
}

fn parse_u32(path: &str, v: &str) -> Result<u32> {
    v.trim().parse().map_err(|_| Error::BadDevice {
        path: path.to_owned(),
        reason: format!("{v:?} is not a number"),
    })
}

/// This domain's id: XenStore's relative `domid` node, else what the platform knows.
fn own_domid(store: &dyn XenbusStore, platform: &Platform) -> Result<DomId> {
    match store.read_opt("domid")? {
        Some(v) => {
            let s = String::from_utf8_lossy(&v).into_owned();
            let d = parse_u32("domid", &s)?;
            u16::try_from(d).map(DomId).map_err(|_| Error::BadDevice {
                path: "domid".into(),
                reason: format!("{d} is not a domain id"),
            })
        }
        None => platform.known_domid().ok_or_else(|| Error::BadDevice {
            path: "domid".into(),
            reason: "XenStore has no relative `domid` node and the platform does not know \
                     this domain's id"
                .into(),
        }),
    }
}

/// Waits until `path` (a xenbus state node) satisfies `done`, watching it.
fn wait_state(
    store: &dyn XenbusStore,
    path: &str,
    timeout: Duration,
    what: &str,
    mut done: impl FnMut(Option<u32>) -> bool,
) -> Result<Option<u32>> {
    let deadline = Instant::now() + timeout;
    let mut watch = store.watch(path)?;
    loop {
        let v = match store.read_opt(path)? {
            Some(b) => Some(parse_u32(path, &String::from_utf8_lossy(&b))?),
            None => None,
        };
        if done(v) {
            return Ok(v);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::Timeout {
                what: format!("{what} ({path} is {v:?})"),
                timeout_ms: timeout.as_millis() as u64,
            });
        }
        watch.next_event(Some(deadline - now))?;
    }
}

/// Waits for the backend's answer to channel instance `nonce`: Connected or Closed in its
/// channel node, which echoes the nonce. A state under another nonce (or none) is the
/// backend's answer to an earlier channel at this index, or no answer yet: never ours.
fn wait_answer(
    store: &dyn XenbusStore,
    back_chan: &str,
    nonce: &str,
    timeout: Duration,
) -> Result<u32> {
    let deadline = Instant::now() + timeout;
    let state_path = ChannelKey::State.path(back_chan);
    let nonce_path = ChannelKey::Nonce.path(back_chan);
    let mut watch = store.watch(&state_path)?;
    loop {
        // The nonce first: the backend writes it with the state in one transaction, so a
        // state read after our nonce answers us.
        let theirs = store.read_opt(&nonce_path)?;
        let st = match store.read_opt(&state_path)? {
            Some(b) => Some(parse_u32(&state_path, &String::from_utf8_lossy(&b))?),
            None => None,
        };
        if theirs.as_deref() == Some(nonce.as_bytes()) {
            if let Some(s @ (state::CONNECTED | state::CLOSED)) = st {
                return Ok(s);
            }
        }
        let now = Instant::now();
        if now >= deadline {
            let whose = if theirs.as_deref() == Some(nonce.as_bytes()) {
                "this channel's"
            } else {
                "an earlier channel's (or none)"
            };
            return Err(Error::Timeout {
                what: format!(
                    "the backend to connect the channel ({state_path} is {st:?}, {whose})"
                ),
                timeout_ms: timeout.as_millis() as u64,
            });
        }
        watch.next_event(Some(deadline - now))?;
    }
}

impl Channel {
    /// Opens device `devid` of this domain and creates a channel on it.
    pub(crate) fn open(
        store: Arc<dyn XenbusStore>,
        platform: Platform,
        cfg: &ChannelConfig,
    ) -> Result<Channel> {
        let domid = own_domid(&*store, &platform)?;
        let front_dev = format!("/local/domain/{}/device/vrdma/{}", domid.0, cfg.devid);
        let Some(back_dev) = store.read_opt(&DeviceKey::Backend.path(&front_dev))? else {
            return Err(Error::NoDevice {
                devid: cfg.devid,
                path: front_dev,
            });
        };
        let back_dev = String::from_utf8_lossy(&back_dev).into_owned();
        let backend_id = store.read_u32(&DeviceKey::BackendId.path(&front_dev))?;
        let backend = u16::try_from(backend_id)
            .map(DomId)
            .map_err(|_| Error::BadDevice {
                path: DeviceKey::BackendId.path(&front_dev),
                reason: format!("{backend_id} is not a domain id"),
            })?;

        // 1. The backend must be there (InitWait) or already connected.
        wait_state(
            &*store,
            &DeviceKey::State.path(&back_dev),
            cfg.timeout,
            "the vrdma backend to publish InitWait",
            |s| matches!(s, Some(state::INIT_WAIT) | Some(state::CONNECTED)),
        )?;
        if let Some(versions) = store.read_opt(&DeviceKey::Versions.path(&back_dev))? {
            let versions = String::from_utf8_lossy(&versions).into_owned();
            let ours = PROTOCOL_VERSION.to_string();
            if !versions.split_whitespace().any(|v| v == ours) {
                return Err(Error::BadDevice {
                    path: back_dev,
                    reason: format!(
                        "the backend speaks protocol versions {versions:?}, we speak {ours}"
                    ),
                });
            }
        }
        let read_limit = |key: DeviceKey| -> Result<Option<u32>> {
            let p = key.path(&back_dev);
            match store.read_opt(&p)? {
                Some(v) => Ok(Some(parse_u32(&p, &String::from_utf8_lossy(&v))?)),
                None => Ok(None),
            }
        };
        let limits = PublishedLimits {
            max_inline: read_limit(DeviceKey::MaxInline)?,
            max_sge: read_limit(DeviceKey::MaxSge)?,
        };
        let backend_addr = match store.read_opt(&DeviceKey::Address.path(&back_dev))? {
            Some(v) => parse_addr(&String::from_utf8_lossy(&v)).unwrap_or([0; 16]),
            None => [0; 16],
        };
        let front_state = DeviceKey::State.path(&front_dev);
        let connected = XenbusState::Connected.value();
        if store.read_opt(&front_state)?.as_deref() != Some(connected.as_bytes()) {
            store.write(&front_state, connected.as_bytes())?;
        }

        // 2. Claim the lowest channel number free on both sides: an index whose backend node
        //    is still there is still being torn down (the backend removes its node only after
        //    it saw ours go), so a fresh index is taken instead of waiting.
        let chan_dir = format!("{front_dev}/{CHANNEL_DIR}");
        let back_chan_dir = format!("{back_dev}/{CHANNEL_DIR}");
        let index = store.transaction(|tx| {
            let mut taken: Vec<u32> = Vec::new();
            for dir in [&chan_dir, &back_chan_dir] {
                match tx.directory(dir) {
                    Ok(v) => taken.extend(v.iter().filter_map(|n| n.parse::<u32>().ok())),
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(e),
                }
            }
            let n = (0..).find(|n| !taken.contains(n)).unwrap_or(0);
            tx.write(
                &ChannelKey::State.path(&channel_path(&front_dev, n)),
                XenbusState::Initialising.value().as_bytes(),
            )?;
            Ok(n)
        })?;
        let front_chan = channel_path(&front_dev, index);
        let back_chan = channel_path(&back_dev, index);
        tracing::debug!(%front_chan, "channel claimed");

        let made = Self::connect(
            store.clone(),
            platform,
            cfg,
            domid,
            backend,
            index,
            front_chan.clone(),
            back_chan,
            backend_addr,
            limits,
        );
        if made.is_err() {
            // Leave nothing behind: the backend ignores a Closed channel.
            let _ = store.write(
                &ChannelKey::State.path(&front_chan),
                XenbusState::Closed.value().as_bytes(),
            );
            let _ = store.rm(&front_chan);
        }
        made
    }

    #[allow(clippy::too_many_arguments)]
    fn connect(
        store: Arc<dyn XenbusStore>,
        platform: Platform,
        cfg: &ChannelConfig,
        domid: DomId,
        backend: DomId,
        index: u32,
        front_chan: String,
        back_chan: String,
        backend_addr: [u8; 16],
        limits: PublishedLimits,
    ) -> Result<Channel> {
        // 3. Event channel, ring page with the alive byte and its unmap-notify.
        let evtchn = platform.alloc_unbound(backend)?;
        let port = evtchn.local_port();
        let ring_page = crate::shm::share(&platform, backend, 1, Access::ReadWrite, |p| {
            p.set_unmap_notify(UnmapNotify {
                clear_byte: Some(ALIVE_BYTE),
                event: Some(port),
            })?;
            Ok(())
        })?;
        let ring = ControlFrontRing::init(ring_page.region.clone())?;
        ring_page
            .region
            .store_u32(ALIVE_BYTE, 1, Ordering::Release)?;
        let ring_ref = ring_page.grefs[0];

        // 4. Publish it, Initialised, with this instance's nonce.
        let nonce = fresh_nonce();
        store.transaction(|tx| {
            tx.write(
                &ChannelKey::RingRef.path(&front_chan),
                ring_ref.to_string().as_bytes(),
            )?;
            tx.write(
                &ChannelKey::EventChannel.path(&front_chan),
                port.0.to_string().as_bytes(),
            )?;
            tx.write(
                &ChannelKey::Version.path(&front_chan),
                PROTOCOL_VERSION.to_string().as_bytes(),
            )?;
            tx.write(
                &ChannelKey::Pid.path(&front_chan),
                std::process::id().to_string().as_bytes(),
            )?;
            tx.write(&ChannelKey::Nonce.path(&front_chan), nonce.as_bytes())?;
            let mode = match cfg.mode {
                crate::Mode::Bypass => MODE_BYPASS,
                crate::Mode::Mediated => MODE_MEDIATED,
            };
            tx.write(&ChannelKey::Mode.path(&front_chan), mode.as_bytes())?;
            tx.write(
                &ChannelKey::State.path(&front_chan),
                state::INITIALISED.to_string().as_bytes(),
            )?;
            Ok(())
        })?;

        // 5. The backend's answer to this instance: Connected, or Closed with a reason.
        let got = wait_answer(&*store, &back_chan, &nonce, cfg.timeout)?;
        if got == state::CLOSED {
            let reason = store
                .read_opt(&ChannelKey::Error.path(&back_chan))?
                .map(|v| String::from_utf8_lossy(&v).into_owned())
                .unwrap_or_else(|| "no reason given".into());
            return Err(Error::ChannelRefused {
                channel: index,
                reason,
            });
        }

        // The backend set its alive byte before it answered Connected; from here on a
        // cleared byte means it went away.
        let alive = ring_page.region.word(BACKEND_ALIVE_BYTE)?;
        let backend_check = || {
            if backend_alive(&alive) {
                Ok(())
            } else {
                Err(Error::DeviceLost(
                    "the backend went away while connecting the channel (its alive byte \
                     in the control ring is 0)"
                        .into(),
                ))
            }
        };
        backend_check()?;
        let hub = EventHub::new(evtchn);
        let control = Control::new(ring, cfg.timeout);
        let (version, doorbell_gref, event_gref, doorbell_slots) = match control.call_checked(
            &hub,
            Request::Init {
                version: PROTOCOL_VERSION,
            },
            &backend_check,
        )? {
            Reply::Init {
                version,
                doorbell_gref,
                event_gref,
                doorbell_slots,
            } => (version, doorbell_gref, event_gref, doorbell_slots),
            r => return Err(Error::protocol(format!("Init answered with {r:?}"))),
        };
        if version != PROTOCOL_VERSION {
            return Err(Error::protocol(format!(
                "backend answered Init with version {version}, we speak {PROTOCOL_VERSION}"
            )));
        }
        let db_region = crate::shm::map(&platform, backend, &[doorbell_gref], Access::ReadWrite)?;
        let doorbell = DoorbellPage::open(db_region, PROTOCOL_VERSION)?;
        if doorbell_slots == 0 || doorbell_slots != doorbell.slots() {
            return Err(Error::protocol(format!(
                "Init says {doorbell_slots} doorbell slots per page, the page has {}",
                doorbell.slots()
            )));
        }
        let event_page = crate::shm::map(&platform, backend, &[event_gref], Access::ReadWrite)?;
        let events = event_ring::consumer(&event_page)?;
        let event_prod = event_page.word(event_ring::field::PROD)?;
        let event_cons = event_page.word(event_ring::field::CONS)?;
        tracing::info!(
            channel = index,
            backend = backend.0,
            "vrdma channel connected"
        );
        Ok(Channel {
            store,
            platform,
            domid,
            backend,
            devid: cfg.devid,
            index,
            front_chan,
            back_chan,
            backend_addr,
            limits,
            hub,
            control,
            doorbell_pages: Mutex::new(vec![Some(doorbell.clone())]),
            slots_per_page: doorbell_slots,
            doorbell,
            events: Mutex::new(events),
            pending: Mutex::new(Vec::new()),
            lost: AtomicBool::new(false),
            lost_reason: Mutex::new(None),
            close_timeout: cfg.close_timeout,
            _ring_page: ring_page.region,
            _event_page: event_page,
            alive,
            event_prod,
            event_cons,
        })
    }

    /// A control request; a dead channel is [`Error::DeviceLost`].
    pub(crate) fn call(&self, request: Request) -> Result<Reply> {
        self.notice_backend();
        self.check_lost()?;
        let gone = || {
            self.notice_backend();
            self.check_lost()
        };
        match self.control.call_checked(&self.hub, request, &gone) {
            Err(e @ Error::Timeout { .. }) => {
                self.probe_backend();
                self.check_lost()?;
                Err(e)
            }
            Err(e) if e.is_device_lost() => {
                self.mark_lost("the backend answered DeviceLost".into());
                Err(e)
            }
            r => r,
        }
    }

    /// [`Error::DeviceLost`] if the channel is known to be dead.
    #[inline]
    pub(crate) fn check_lost(&self) -> Result<()> {
        if self.lost.load(Ordering::Relaxed) {
            return Err(self.lost_error());
        }
        Ok(())
    }

    /// The error of a lost channel (out of the data path's line: one load when alive).
    #[cold]
    #[inline(never)]
    fn lost_error(&self) -> Error {
        let why = self
            .lost_reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_default();
        Error::DeviceLost(why)
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Relaxed)
    }

    pub(crate) fn mark_lost(&self, why: String) {
        let mut r = self.lost_reason.lock().unwrap_or_else(|e| e.into_inner());
        if r.is_none() {
            tracing::warn!(channel = self.index, "vrdma device lost: {why}");
            *r = Some(why);
        }
        self.lost.store(true, Ordering::Relaxed);
    }

    /// Notices a backend that went away: its alive byte in the control ring, cleared by the
    /// unmap-notify of its mapping when its process exits or is killed (and when it closes
    /// the channel). One load, no system call while the byte is set.
    #[inline]
    pub(crate) fn notice_backend(&self) {
        if !self.lost.load(Ordering::Relaxed) && !backend_alive(&self.alive) {
            self.backend_gone();
        }
    }

    #[cold]
    fn backend_gone(&self) {
        // Once: a backend that closed the channel politely says why in XenStore.
        self.probe_backend();
        if !self.is_lost() {
            self.mark_lost(
                "the backend went away (it no longer maps the channel's control ring: its \
                 process exited or was killed)"
                    .into(),
            );
        }
    }

    /// Looks at the backend's channel node; a channel it closed or removed is lost.
    pub(crate) fn probe_backend(&self) {
        let st = ChannelKey::State.path(&self.back_chan);
        match self.store.read_opt(&st) {
            Ok(Some(v)) if v == XenbusState::Connected.value().as_bytes() => {}
            Ok(Some(v)) => {
                let err = self
                    .store
                    .read_opt(&ChannelKey::Error.path(&self.back_chan))
                    .ok()
                    .flatten()
                    .map(|e| String::from_utf8_lossy(&e).into_owned())
                    .unwrap_or_else(|| "no reason given".into());
                self.mark_lost(format!(
                    "the backend moved the channel to state {}: {err}",
                    String::from_utf8_lossy(&v)
                ));
            }
            Ok(None) => self.mark_lost("the backend removed the channel".into()),
            Err(e) => self.mark_lost(format!("XenStore is unreachable: {e}")),
        }
    }

    /// Moves events from the async event ring to the pending list (no system call). A
    /// `DeviceLost` event marks the channel.
    pub(crate) fn pump_events(&self) -> Result<()> {
        let mut c = self.events.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let mut any = false;
        while let Some(raw) = c
            .pop()
            .map_err(|e| Error::protocol(format!("event ring: {e}")))?
        {
            any = true;
            match EventRepr::from_bytes(&raw) {
                Ok(ev) => {
                    let ev = AsyncEvent::from(ev);
                    if ev.kind == shared_ring::abi::event::EventKind::DeviceLost {
                        self.mark_lost("the backend reported DeviceLost".into());
                    }
                    out.push(ev);
                }
                Err(e) => tracing::warn!("malformed async event: {e}"),
            }
        }
        if any {
            c.release();
        }
        Ok(())
    }

    /// Notices async events without a system call or a lock when there are none: two loads
    /// of the event ring's indexes. Pending events are pumped (a `DeviceLost` marks the
    /// channel); then a dead channel is [`Error::DeviceLost`].
    #[inline]
    pub(crate) fn notice_events(&self) -> Result<()> {
        let prod = self.event_prod.load(Ordering::Acquire);
        let cons = self.event_cons.load(Ordering::Relaxed);
        if prod != cons {
            self.pump_events()?;
        }
        self.notice_backend();
        self.check_lost()
    }

    /// The first pending event `pred` picks, taken out of the pending list (the others stay
    /// for [`Channel::take_events`]).
    pub(crate) fn take_event(
        &self,
        pred: &dyn Fn(&AsyncEvent) -> bool,
    ) -> Result<Option<AsyncEvent>> {
        self.pump_events()?;
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        Ok(p.iter().position(pred).map(|i| p.remove(i)))
    }

    /// Puts a taken event back in front of the pending ones (for another waiter) and wakes
    /// the waiters.
    pub(crate) fn requeue_event(&self, ev: AsyncEvent) {
        use crate::signal::Signal;
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(0, ev);
        self.hub.wake_all();
    }

    /// Waits for an event `pred` picks (taking it) until `deadline`: `None` when it passed. A
    /// lost channel is [`Error::DeviceLost`], not a hang.
    pub(crate) fn wait_event(
        &self,
        pred: &dyn Fn(&AsyncEvent) -> bool,
        deadline: Option<std::time::Instant>,
    ) -> Result<Option<AsyncEvent>> {
        use crate::signal::Signal;
        loop {
            let epoch = self.hub.epoch();
            if let Some(e) = self.take_event(pred)? {
                return Ok(Some(e));
            }
            self.notice_backend();
            self.check_lost()?;
            if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                return Ok(None);
            }
            if !self.hub.wait_after(epoch, deadline)? {
                // No event for a while: is the backend still there?
                self.probe_backend();
            }
        }
    }

    /// Every pending event `pred` picks (the others stay).
    pub(crate) fn take_events_where(
        &self,
        pred: &dyn Fn(&AsyncEvent) -> bool,
    ) -> Result<Vec<AsyncEvent>> {
        self.pump_events()?;
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let (take, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut *p).into_iter().partition(pred);
        *p = keep;
        Ok(take)
    }

    /// Every event received since the last call.
    pub(crate) fn take_events(&self) -> Result<Vec<AsyncEvent>> {
        self.pump_events()?;
        Ok(std::mem::take(
            &mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()),
        ))
    }

    /// Device limits (`QueryDevice`).
    pub(crate) fn query_device(&self) -> Result<DeviceAttrs> {
        match self.call(Request::QueryDevice)? {
            Reply::Device(d) => Ok(d),
            r => Err(Error::protocol(format!("QueryDevice answered with {r:?}"))),
        }
    }

    /// Maps a page list the backend granted (walking directory pages if needed).
    pub(crate) fn map_page_list(&self, list: &PageList, access: Access) -> Result<SharedRegion> {
        let mut walker = PageDirWalker::new(list);
        while let Some(dir) = walker.next_dir_gref() {
            let page = crate::shm::map(&self.platform, self.backend, &[dir], Access::ReadOnly)?;
            walker
                .read_dir_page(&page)
                .map_err(|e| Error::protocol(format!("page directory: {e}")))?;
        }
        let grefs = walker.into_grefs();
        crate::shm::map(&self.platform, self.backend, &grefs, access)
    }

    /// The doorbell page holding channel slot `slot` and the slot's number in it. `gref` is the
    /// page's grant as the backend's `CreateCq`/`CreateQp` answer gave it; a page not seen
    /// before is mapped (the backend grants pages on demand; they stay until the channel goes).
    pub(crate) fn doorbell_slot(&self, slot: u32, gref: u32) -> Result<(DoorbellPage, u32)> {
        let page = (slot / self.slots_per_page) as usize;
        let k = slot % self.slots_per_page;
        if page >= MAX_DOORBELL_PAGES {
            return Err(Error::protocol(format!(
                "doorbell slot {slot} is on page {page}; at most {MAX_DOORBELL_PAGES} pages exist"
            )));
        }
        let mut pages = self
            .doorbell_pages
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if pages.len() <= page {
            pages.resize(page + 1, None);
        }
        if pages[page].is_none() {
            let region = crate::shm::map(&self.platform, self.backend, &[gref], Access::ReadWrite)?;
            let db = DoorbellPage::open(region, PROTOCOL_VERSION)?;
            if db.slots() != self.slots_per_page {
                return Err(Error::protocol(format!(
                    "doorbell page {page} has {} slots, page 0 has {}",
                    db.slots(),
                    self.slots_per_page
                )));
            }
            tracing::debug!(channel = self.index, page, "doorbell page mapped");
            pages[page] = Some(db);
        }
        let db = pages[page].clone().expect("mapped above");
        Ok((db, k))
    }

    /// Notifies the backend (kicks a sleeping engine).
    #[inline]
    pub(crate) fn kick(&self) -> Result<()> {
        self.hub.notify()
    }

    fn close(&self) {
        let st = |s: u32| s.to_string();
        let _ = self.store.write(
            &ChannelKey::State.path(&self.front_chan),
            st(state::CLOSING).as_bytes(),
        );
        let _ = self.hub.notify();
        if !self.is_lost() {
            let r = wait_state(
                &*self.store,
                &ChannelKey::State.path(&self.back_chan),
                self.close_timeout,
                "the backend to close the channel",
                |s| matches!(s, None | Some(state::CLOSED)),
            );
            if let Err(e) = r {
                tracing::warn!(channel = self.index, "closing: {e}");
            }
        }
        let _ = self.store.write(
            &ChannelKey::State.path(&self.front_chan),
            st(state::CLOSED).as_bytes(),
        );
        let _ = self.store.rm(&self.front_chan);
        tracing::debug!(channel = self.index, "vrdma channel closed");
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        self.close();
    }
}

/// Parses a backend address: an IPv6 or IPv4 address (v4-mapped), as XenStore text.
pub(crate) fn parse_addr(s: &str) -> Option<[u8; 16]> {
    let ip: std::net::IpAddr = s.trim().parse().ok()?;
    Some(match ip {
        std::net::IpAddr::V6(a) => a.octets(),
        std::net::IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
    })
}

/// Number of pages holding `bytes`.
pub(crate) fn pages_for(bytes: usize) -> usize {
    bytes.div_ceil(PAGE_SIZE)
}
