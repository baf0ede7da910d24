//! The per-channel handshake as the backend follows it (Initialised → Connected | Closed with
//! an error; Closing → Closing, Closed; reclaim on death), for the channels of one device.
//!
//! [`DeviceChannels`] owns every channel record of a device; the device state machine
//! (`backend.rs`) calls it through a handful of methods and never touches a record itself.

use std::collections::BTreeMap;
use std::sync::Arc;

use shared_ring::abi::xenstore::{
    channel_path, ChannelKey, CHANNEL_DIR, MODE_BYPASS, MODE_MEDIATED,
};
use shared_ring::PROTOCOL_VERSION;
use xenstore_proto::client::{Result, XenbusStore, XenbusStoreExt};

use super::paths::{self, ignore_enoent, list, read_nonce, write_nonce};
use super::{
    ChannelFault, ChannelLink, ChannelOpener, ChannelRequest, CloseReason, DeviceId, XenbusState,
};
use crate::device::ChannelMode;
use crate::resources::{Account, Quotas, Resource};

/// The instance nonce of a channel (`channel/<n>/nonce`, written by the frontend with
/// Initialised and echoed by the backend with every state it writes): it tells one channel
/// from an earlier one that used the same index. `None` when the frontend wrote none.
type Nonce = Option<String>;

/// The backend's view of one channel instance.
enum ChannelRecord {
    /// Connected: the control service runs.
    Live(Box<dyn ChannelLink>, Nonce),
    /// The backend wrote Closed (refused, failed, closed, or left by an earlier backend);
    /// waiting for the frontend to remove its node.
    Closed(Nonce),
}

impl ChannelRecord {
    fn is_live(&self) -> bool {
        matches!(self, ChannelRecord::Live(..))
    }

    /// The nonce of the instance this record is about.
    fn nonce(&self) -> Option<&str> {
        match self {
            ChannelRecord::Live(_, n) | ChannelRecord::Closed(n) => n.as_deref(),
        }
    }
}

/// The channels of one device: every `channel/<n>` record and its handshake.
pub(super) struct DeviceChannels {
    device: DeviceId,
    /// The device's frontend node (`.../device/vrdma/<devid>`).
    frontend_path: String,
    /// The device's backend node (`.../backend/vrdma/<D>/<devid>`; quotas live there).
    backend_path: String,
    /// The device's resource account; each live channel is charged to it.
    account: Arc<Account>,
    records: BTreeMap<u32, ChannelRecord>,
}

impl DeviceChannels {
    pub(super) fn new(
        device: DeviceId,
        frontend_path: String,
        backend_path: String,
        account: Arc<Account>,
    ) -> DeviceChannels {
        DeviceChannels {
            device,
            frontend_path,
            backend_path,
            account,
            records: BTreeMap::new(),
        }
    }

    /// The live channels.
    pub(super) fn live(&self) -> Vec<u32> {
        self.records
            .iter()
            .filter(|(_, c)| c.is_live())
            .map(|(&n, _)| n)
            .collect()
    }

    /// Channels in the backend node when a device is found were made by an earlier backend
    /// process: they are closed with "backend restarted", and forgotten once the frontend
    /// removes them. Returns how many were still open.
    pub(super) fn adopt_stale(&mut self, store: &dyn XenbusStore) -> Result<usize> {
        let dir = format!("{}/{CHANNEL_DIR}", self.backend_path);
        let mut n_closed = 0;
        for name in list(store, &dir)? {
            let Some(n) = paths::parse_index(&name) else {
                continue;
            };
            let p = format!("{dir}/{name}");
            let state = store
                .read_opt(&ChannelKey::State.path(&p))?
                .and_then(|v| XenbusState::parse(&v));
            if state != Some(XenbusState::Closed) {
                store.transaction(|t| {
                    t.write(&ChannelKey::Error.path(&p), b"backend restarted")?;
                    t.write(
                        &ChannelKey::State.path(&p),
                        XenbusState::Closed.value().as_bytes(),
                    )
                })?;
                tracing::info!(device = %self.device, channel = n, "stale channel closed: backend restarted");
                n_closed += 1;
            }
            let nonce = read_nonce(store, &p)?;
            self.records.insert(n, ChannelRecord::Closed(nonce));
        }
        Ok(n_closed)
    }

    /// Follows every `channel/<n>` of the frontend; connects new ones when `active` (with
    /// `opener`, charging quotas read from the backend node over `defaults`).
    pub(super) fn scan(
        &mut self,
        store: &dyn XenbusStore,
        opener: &mut dyn ChannelOpener,
        defaults: Quotas,
        active: bool,
    ) -> Result<()> {
        let id = self.device;
        let fdir = format!("{}/{CHANNEL_DIR}", self.frontend_path);
        let bdir = format!("{}/{CHANNEL_DIR}", self.backend_path);
        let mut frontend: BTreeMap<u32, (Option<XenbusState>, Nonce)> = BTreeMap::new();
        for name in list(store, &fdir)? {
            let Some(n) = paths::parse_index(&name) else {
                continue;
            };
            // The nonce first: the frontend writes it with Initialised in one transaction, so
            // a state read after it is of the same instance or a later one.
            let nonce = read_nonce(store, &format!("{fdir}/{name}"))?;
            let st = store
                .read_opt(&ChannelKey::State.path(&format!("{fdir}/{name}")))?
                .and_then(|v| XenbusState::parse(&v));
            frontend.insert(n, (st, nonce));
        }
        // Channels the frontend removed: reclaim, then remove ours.
        let known: Vec<u32> = self.records.keys().copied().collect();
        for n in known {
            if frontend.contains_key(&n) {
                continue;
            }
            self.close(n, &CloseReason::Frontend, false);
            self.records.remove(&n);
            store.rm(&format!("{bdir}/{n}")).or_else(ignore_enoent)?;
            tracing::debug!(device = %id, channel = n, "channel removed");
        }
        // Backend channel nodes with no record and no frontend node are leftovers.
        for name in list(store, &bdir)? {
            if let Some(n) = paths::parse_index(&name) {
                if !frontend.contains_key(&n) && !self.records.contains_key(&n) {
                    store.rm(&format!("{bdir}/{n}")).or_else(ignore_enoent)?;
                }
            }
        }
        for (n, (st, nonce)) in frontend {
            // A record of an earlier instance at this index: its frontend removed its node and
            // a new one took the index before we saw the removal (watch events coalesce). The
            // old instance is over; the new one is served on its own.
            let obsolete = self
                .records
                .get(&n)
                .is_some_and(|r| r.nonce() != nonce.as_deref());
            if obsolete {
                self.close(n, &CloseReason::Frontend, true);
                self.records.remove(&n);
                tracing::debug!(device = %id, channel = n, "a new channel instance took the index");
            }
            let live = match self.records.get(&n) {
                Some(ChannelRecord::Live(..)) => true,
                Some(ChannelRecord::Closed(_)) => continue,
                None => false,
            };
            match (live, st) {
                (true, Some(XenbusState::Closing)) => {
                    self.close(n, &CloseReason::Frontend, true);
                    self.finish_close(store, n, nonce.as_deref(), None, true)?;
                }
                (true, Some(XenbusState::Closed)) | (true, None) => {
                    self.close(n, &CloseReason::Frontend, true);
                    self.finish_close(store, n, nonce.as_deref(), None, false)?;
                }
                (true, _) => {}
                (false, Some(XenbusState::Initialised)) if active => {
                    self.connect(store, opener, defaults, n)?
                }
                (false, Some(XenbusState::Initialised)) => self.refuse(
                    store,
                    n,
                    nonce.as_deref(),
                    "the device is not connected (detached or closing)",
                )?,
                (false, Some(XenbusState::Closing | XenbusState::Closed)) => {
                    self.finish_close(store, n, nonce.as_deref(), None, false)?
                }
                (false, Some(XenbusState::Connected)) => self.refuse(
                    store,
                    n,
                    nonce.as_deref(),
                    "this channel was not connected by the running backend (backend restarted)",
                )?,
                (false, _) => {}
            }
        }
        Ok(())
    }

    /// Connects channel `n`: validates what the frontend wrote, charges the quota, opens the
    /// live channel, answers Connected; on any failure answers Closed with an error.
    fn connect(
        &mut self,
        store: &dyn XenbusStore,
        opener: &mut dyn ChannelOpener,
        defaults: Quotas,
        n: u32,
    ) -> Result<()> {
        let id = self.device;
        let fpath = channel_path(&self.frontend_path, n);
        // The nonce first (see scan): the fields read after it are of its instance.
        let nonce = read_nonce(store, &fpath)?;
        let nonce_ref = nonce.as_deref();
        let req = match self.read_request(store, n, &fpath)? {
            Ok(r) => r,
            Err(why) => return self.refuse(store, n, nonce_ref, &why),
        };
        let account = req.account.clone();
        account.set_quotas(paths::read_quotas(store, &self.backend_path, defaults, id)?);
        if let Err(e) = account.charge(Resource::Channels, 1) {
            return self.refuse(store, n, nonce_ref, &e.to_string());
        }
        let (version, pid, mode) = (req.version, req.pid, req.mode);
        let link = match opener.open(req) {
            Ok(link) => link,
            Err(why) => {
                account.refund(Resource::Channels, 1);
                return self.refuse(store, n, nonce_ref, &why);
            }
        };
        let bpath = channel_path(&self.backend_path, n);
        let written = store.transaction(|t| {
            let err = ChannelKey::Error.path(&bpath);
            if t.exists(&err)? {
                t.rm(&err)?;
            }
            write_nonce(t, &bpath, nonce_ref)?;
            t.write(
                &ChannelKey::State.path(&bpath),
                XenbusState::Connected.value().as_bytes(),
            )
        });
        if let Err(e) = written {
            link.close(&CloseReason::Shutdown);
            account.refund(Resource::Channels, 1);
            return Err(e);
        }
        self.records.insert(n, ChannelRecord::Live(link, nonce));
        tracing::info!(
            device = %id,
            channel = n,
            "channel connected (pid {}, version {version}, {mode:?} mode)",
            pid.map(|p| p.to_string()).unwrap_or_else(|| "?".into())
        );
        Ok(())
    }

    /// What the frontend wrote for channel `n` (at `fpath`), validated; a sentence saying
    /// what is wrong otherwise.
    fn read_request(
        &self,
        store: &dyn XenbusStore,
        n: u32,
        fpath: &str,
    ) -> Result<std::result::Result<ChannelRequest, String>> {
        let read_u32 = |key: ChannelKey| -> Result<std::result::Result<u32, String>> {
            let path = key.path(fpath);
            Ok(match store.read_opt(&path)? {
                None => Err(format!("channel/{n}/{key} is missing")),
                Some(v) => std::str::from_utf8(&v)
                    .ok()
                    .and_then(|s| s.trim().parse::<u32>().ok())
                    .ok_or_else(|| {
                        format!(
                            "channel/{n}/{key} = {:?} is not a number",
                            String::from_utf8_lossy(&v)
                        )
                    }),
            })
        };
        let version = match read_u32(ChannelKey::Version)? {
            Ok(v) => v,
            Err(e) => return Ok(Err(e)),
        };
        if version != PROTOCOL_VERSION {
            return Ok(Err(format!(
                "protocol version {version} is not supported; this backend speaks version {PROTOCOL_VERSION}"
            )));
        }
        let ring_ref = match read_u32(ChannelKey::RingRef)? {
            Ok(v) => v,
            Err(e) => return Ok(Err(e)),
        };
        let event_channel = match read_u32(ChannelKey::EventChannel)? {
            Ok(v) => v,
            Err(e) => return Ok(Err(e)),
        };
        let pid = read_u32(ChannelKey::Pid)?.ok();
        let mode = match store.read_opt(&ChannelKey::Mode.path(fpath))? {
            None => ChannelMode::Bypass,
            Some(v) => match v.trim_ascii() {
                b"" => ChannelMode::Bypass,
                v if v == MODE_BYPASS.as_bytes() => ChannelMode::Bypass,
                v if v == MODE_MEDIATED.as_bytes() => ChannelMode::Mediated,
                other => {
                    return Ok(Err(format!(
                        "channel/{n}/{} = {:?} is neither {MODE_BYPASS:?} nor {MODE_MEDIATED:?}",
                        ChannelKey::Mode,
                        String::from_utf8_lossy(other)
                    )))
                }
            },
        };
        Ok(Ok(ChannelRequest {
            device: self.device,
            channel: n,
            ring_ref,
            event_channel,
            version,
            pid,
            mode,
            account: self.account.clone(),
        }))
    }

    /// Answers channel instance `nonce` at index `n` with Closed and an error sentence.
    fn refuse(
        &mut self,
        store: &dyn XenbusStore,
        n: u32,
        nonce: Option<&str>,
        why: &str,
    ) -> Result<()> {
        tracing::warn!(device = %self.device, channel = n, "channel refused: {why}");
        self.finish_close(store, n, nonce, Some(why), false)
    }

    /// Writes the backend channel node's Closed (after Closing when `closing_first`), with
    /// `error` if given (an earlier one is removed otherwise) and the instance's `nonce`, and
    /// records the channel as Closed.
    fn finish_close(
        &mut self,
        store: &dyn XenbusStore,
        n: u32,
        nonce: Option<&str>,
        error: Option<&str>,
        closing_first: bool,
    ) -> Result<()> {
        self.records
            .insert(n, ChannelRecord::Closed(nonce.map(str::to_owned)));
        let bpath = channel_path(&self.backend_path, n);
        let write = |state: XenbusState, error: Option<&str>| {
            store.transaction(|t| {
                let err = ChannelKey::Error.path(&bpath);
                match error {
                    Some(why) => t.write(&err, why.as_bytes())?,
                    None if t.exists(&err)? => t.rm(&err)?,
                    None => {}
                }
                write_nonce(t, &bpath, nonce)?;
                t.write(&ChannelKey::State.path(&bpath), state.value().as_bytes())
            })
        };
        if closing_first {
            write(XenbusState::Closing, None)?;
        }
        write(XenbusState::Closed, error)
    }

    /// Closes live channel `n` (reclaiming it) if it is live; the record stays (as Closed)
    /// for the caller to update. Returns whether it was live.
    fn close(&mut self, n: u32, reason: &CloseReason, log: bool) -> bool {
        let nonce = match self.records.get(&n) {
            Some(ChannelRecord::Live(_, nonce)) => nonce.clone(),
            _ => return false,
        };
        let Some(ChannelRecord::Live(link, _)) =
            self.records.insert(n, ChannelRecord::Closed(nonce))
        else {
            return false;
        };
        link.close(reason);
        self.account.refund(Resource::Channels, 1);
        let id = self.device;
        if log {
            tracing::info!(device = %id, channel = n, "channel closed and reclaimed: {reason}");
        } else {
            tracing::info!(device = %id, channel = n, "channel reclaimed: {reason}");
        }
        true
    }

    /// Closes every live channel; with `polite`, each gets Closing then Closed (and an error
    /// naming the reason) in the backend node. Returns how many were live.
    pub(super) fn close_all(
        &mut self,
        store: &dyn XenbusStore,
        reason: &CloseReason,
        polite: bool,
    ) -> usize {
        let live = self.live();
        for &n in &live {
            self.close(n, reason, true);
            if polite {
                let why = (*reason != CloseReason::Frontend).then(|| reason.to_string());
                let nonce = self.record_nonce(n);
                if let Err(e) = self.finish_close(store, n, nonce.as_deref(), why.as_deref(), true)
                {
                    tracing::warn!(device = %self.device, channel = n, "cannot write the channel's Closed state: {e}");
                }
            }
        }
        live.len()
    }

    /// The frontend node went: forgets every record (the caller closed the live ones) and
    /// removes the backend's `channel` directory.
    pub(super) fn forget_all(&mut self, store: &dyn XenbusStore) -> Result<()> {
        self.records.clear();
        store
            .rm(&format!("{}/{CHANNEL_DIR}", self.backend_path))
            .or_else(ignore_enoent)
    }

    /// The nonce of the instance recorded at index `n`.
    fn record_nonce(&self, n: u32) -> Nonce {
        self.records
            .get(&n)
            .and_then(|r| r.nonce().map(str::to_owned))
    }

    /// A live channel reported a fault (from its control service, through the daemon).
    pub(super) fn fault(
        &mut self,
        store: &dyn XenbusStore,
        n: u32,
        fault: ChannelFault,
    ) -> Result<()> {
        let id = self.device;
        match fault {
            ChannelFault::Died => {
                if !self.close(n, &CloseReason::ProcessDied, true) {
                    return Ok(());
                }
                let fpath = channel_path(&self.frontend_path, n);
                let bpath = channel_path(&self.backend_path, n);
                // The process is gone: nobody will remove its node; we may (if privileged).
                match store.rm(&fpath).or_else(ignore_enoent) {
                    Ok(()) => {
                        store.rm(&bpath).or_else(ignore_enoent)?;
                        self.records.remove(&n);
                        tracing::info!(device = %id, channel = n, "channel nodes removed");
                        Ok(())
                    }
                    Err(e) if e.is_access_denied() => {
                        let nonce = self.record_nonce(n);
                        self.finish_close(
                            store,
                            n,
                            nonce.as_deref(),
                            Some("the frontend process died"),
                            false,
                        )
                    }
                    Err(e) => Err(e),
                }
            }
            ChannelFault::Protocol(why) => {
                let reason = CloseReason::ProtocolError(why);
                if !self.close(n, &reason, true) {
                    return Ok(());
                }
                let nonce = self.record_nonce(n);
                self.finish_close(store, n, nonce.as_deref(), Some(&reason.to_string()), false)
            }
        }
    }
}
