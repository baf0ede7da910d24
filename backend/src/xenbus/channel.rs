//! The frontend side of a device as the backend follows it: the device's frontend state and
//! the per-channel handshake (Initialised → Connected | Closed with an error; Closing →
//! Closing, Closed; reclaim on death).

use std::collections::BTreeMap;

use shared_ring::PROTOCOL_VERSION;
use xenstore_proto::client::{NodeOps, Result, XenbusStore, XenbusStoreExt};

use super::backend::{ignore_enoent, list, XenbusBackend};
use super::paths;
use super::{ChannelFault, ChannelLink, ChannelRequest, CloseReason, DeviceId, XenbusState};
use crate::device::ChannelMode;
use crate::resources::Resource;

/// The instance nonce of a channel (`channel/<n>/nonce`, written by the frontend with
/// Initialised and echoed by the backend with every state it writes): it tells one channel
/// from an earlier one that used the same index. `None` when the frontend wrote none.
pub(super) type Nonce = Option<String>;

/// The backend's view of one channel instance.
pub(super) enum ChannelRecord {
    /// Connected: the control service runs.
    Live(Box<dyn ChannelLink>, Nonce),
    /// The backend wrote Closed (refused, failed, closed, or left by an earlier backend);
    /// waiting for the frontend to remove its node.
    Closed(Nonce),
}

impl ChannelRecord {
    pub(super) fn is_live(&self) -> bool {
        matches!(self, ChannelRecord::Live(..))
    }

    /// The nonce of the instance this record is about.
    pub(super) fn nonce(&self) -> Option<&str> {
        match self {
            ChannelRecord::Live(_, n) | ChannelRecord::Closed(n) => n.as_deref(),
        }
    }
}

/// Reads a channel node's `nonce` (absent, or not text: `None`).
pub(super) fn read_nonce(store: &dyn XenbusStore, chan_path: &str) -> Result<Nonce> {
    Ok(store
        .read_opt(&format!("{chan_path}/nonce"))?
        .and_then(|v| String::from_utf8(v).ok()))
}

/// Writes (or removes) the backend channel node's `nonce` in a transaction.
fn write_nonce(t: &dyn NodeOps, bpath: &str, nonce: Option<&str>) -> Result<()> {
    let p = format!("{bpath}/nonce");
    match nonce {
        Some(v) => t.write(&p, v.as_bytes()),
        None if t.exists(&p)? => t.rm(&p),
        None => Ok(()),
    }
}

impl XenbusBackend {
    /// A watch fired on the device's frontend node: follow the device state and its channels.
    pub fn scan_frontend(&mut self, id: DeviceId) -> Result<()> {
        let Some(dev) = self.devices.get(&id) else {
            return Ok(());
        };
        let fpath = dev.frontend_path.clone();
        let Some(fstate) = self.store.read_opt(&format!("{fpath}/state"))? else {
            if dev.frontend_seen {
                return self.frontend_gone(id, CloseReason::DomainGone);
            }
            return Ok(());
        };
        if let Some(d) = self.devices.get_mut(&id) {
            d.frontend_seen = true;
        }
        let fstate = XenbusState::parse(&fstate);
        let written = self.devices[&id].written;
        match fstate {
            Some(XenbusState::Connected) if written == Some(XenbusState::InitWait) => {
                self.write_device_state(id, XenbusState::Connected)?;
                tracing::info!(device = %id, "frontend driver present: device Connected");
            }
            Some(XenbusState::Closing)
                if matches!(
                    written,
                    Some(XenbusState::InitWait | XenbusState::Connected)
                ) =>
            {
                let n = self.close_all_channels(id, &CloseReason::Frontend, true);
                self.write_device_state(id, XenbusState::Closing)?;
                tracing::info!(device = %id, "frontend closing the device: {n} channels closed");
            }
            Some(XenbusState::Closed) if written != Some(XenbusState::Closed) => {
                let n = self.close_all_channels(id, &CloseReason::Frontend, true);
                self.write_device_state(id, XenbusState::Closed)?;
                tracing::info!(device = %id, "frontend closed the device: {n} channels closed");
            }
            Some(XenbusState::Initialising | XenbusState::InitWait)
                if matches!(written, Some(XenbusState::Closing | XenbusState::Closed)) =>
            {
                // The frontend starts over after a close; serve it again if still online.
                let base = self.devices[&id].backend_path.clone();
                if super::backend::read_flag(&*self.store, &format!("{base}/online"))? {
                    tracing::info!(device = %id, "frontend re-initialising the device");
                    self.publish_init_wait(id)?;
                }
            }
            _ => {}
        }
        let active = self.devices.get(&id).is_some_and(|d| d.active());
        self.scan_channels(id, active)
    }

    /// Follows every `channel/<n>` of the frontend; connects new ones when `active`.
    fn scan_channels(&mut self, id: DeviceId, active: bool) -> Result<()> {
        let (fdir, bdir) = {
            let d = &self.devices[&id];
            (
                format!("{}/channel", d.frontend_path),
                format!("{}/channel", d.backend_path),
            )
        };
        let mut frontend: BTreeMap<u32, (Option<XenbusState>, Nonce)> = BTreeMap::new();
        for name in list(&*self.store, &fdir)? {
            let Some(n) = paths::parse_index(&name) else {
                continue;
            };
            // The nonce first: the frontend writes it with Initialised in one transaction, so
            // a state read after it is of the same instance or a later one.
            let nonce = read_nonce(&*self.store, &format!("{fdir}/{name}"))?;
            let st = self
                .store
                .read_opt(&format!("{fdir}/{name}/state"))?
                .and_then(|v| XenbusState::parse(&v));
            frontend.insert(n, (st, nonce));
        }
        // Channels the frontend removed: reclaim, then remove ours.
        let known: Vec<u32> = self.devices[&id].channels.keys().copied().collect();
        for n in known {
            if frontend.contains_key(&n) {
                continue;
            }
            self.close_channel(id, n, &CloseReason::Frontend, false);
            if let Some(d) = self.devices.get_mut(&id) {
                d.channels.remove(&n);
            }
            self.store
                .rm(&format!("{bdir}/{n}"))
                .or_else(ignore_enoent)?;
            tracing::debug!(device = %id, channel = n, "channel removed");
        }
        // Backend channel nodes with no record and no frontend node are leftovers.
        for name in list(&*self.store, &bdir)? {
            if let Some(n) = paths::parse_index(&name) {
                if !frontend.contains_key(&n) && !self.devices[&id].channels.contains_key(&n) {
                    self.store
                        .rm(&format!("{bdir}/{n}"))
                        .or_else(ignore_enoent)?;
                }
            }
        }
        for (n, (st, nonce)) in frontend {
            // A record of an earlier instance at this index: its frontend removed its node and
            // a new one took the index before we saw the removal (watch events coalesce). The
            // old instance is over; the new one is served on its own.
            let obsolete = self.devices[&id]
                .channels
                .get(&n)
                .is_some_and(|r| r.nonce() != nonce.as_deref());
            if obsolete {
                self.close_channel(id, n, &CloseReason::Frontend, true);
                if let Some(d) = self.devices.get_mut(&id) {
                    d.channels.remove(&n);
                }
                tracing::debug!(device = %id, channel = n, "a new channel instance took the index");
            }
            let live = match self.devices[&id].channels.get(&n) {
                Some(ChannelRecord::Live(..)) => true,
                Some(ChannelRecord::Closed(_)) => continue,
                None => false,
            };
            match (live, st) {
                (true, Some(XenbusState::Closing)) => {
                    self.close_channel(id, n, &CloseReason::Frontend, true);
                    self.finish_close(id, n, nonce.as_deref(), None, true)?;
                }
                (true, Some(XenbusState::Closed)) | (true, None) => {
                    self.close_channel(id, n, &CloseReason::Frontend, true);
                    self.finish_close(id, n, nonce.as_deref(), None, false)?;
                }
                (true, _) => {}
                (false, Some(XenbusState::Initialised)) if active => self.connect(id, n)?,
                (false, Some(XenbusState::Initialised)) => self.refuse(
                    id,
                    n,
                    nonce.as_deref(),
                    "the device is not connected (detached or closing)",
                )?,
                (false, Some(XenbusState::Closing | XenbusState::Closed)) => {
                    self.finish_close(id, n, nonce.as_deref(), None, false)?
                }
                (false, Some(XenbusState::Connected)) => self.refuse(
                    id,
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
    fn connect(&mut self, id: DeviceId, n: u32) -> Result<()> {
        let fpath = format!("{}/channel/{n}", self.devices[&id].frontend_path);
        // The nonce first (see scan_channels): the fields read after it are of its instance.
        let nonce = read_nonce(&*self.store, &fpath)?;
        let nonce_ref = nonce.as_deref();
        let req = match self.read_channel_request(id, n, &fpath)? {
            Ok(r) => r,
            Err(why) => return self.refuse(id, n, nonce_ref, &why),
        };
        let account = req.account.clone();
        account.set_quotas(self.read_quotas(id)?);
        if let Err(e) = account.charge(Resource::Channels, 1) {
            return self.refuse(id, n, nonce_ref, &e.to_string());
        }
        let (version, pid, mode) = (req.version, req.pid, req.mode);
        let link = match self.opener.open(req) {
            Ok(link) => link,
            Err(why) => {
                account.refund(Resource::Channels, 1);
                return self.refuse(id, n, nonce_ref, &why);
            }
        };
        let bpath = format!("{}/channel/{n}", self.devices[&id].backend_path);
        let written = self.store.transaction(|t| {
            if t.exists(&format!("{bpath}/error"))? {
                t.rm(&format!("{bpath}/error"))?;
            }
            write_nonce(t, &bpath, nonce_ref)?;
            t.write(
                &format!("{bpath}/state"),
                XenbusState::Connected.value().as_bytes(),
            )
        });
        if let Err(e) = written {
            link.close(&CloseReason::Shutdown);
            account.refund(Resource::Channels, 1);
            return Err(e);
        }
        if let Some(d) = self.devices.get_mut(&id) {
            d.channels.insert(n, ChannelRecord::Live(link, nonce));
        }
        tracing::info!(
            device = %id,
            channel = n,
            "channel connected (pid {}, version {version}, {mode:?} mode)",
            pid.map(|p| p.to_string()).unwrap_or_else(|| "?".into())
        );
        Ok(())
    }

    fn read_channel_request(
        &self,
        id: DeviceId,
        n: u32,
        fpath: &str,
    ) -> Result<std::result::Result<ChannelRequest, String>> {
        let read_u32 = |key: &str| -> Result<std::result::Result<u32, String>> {
            let path = format!("{fpath}/{key}");
            Ok(match self.store.read_opt(&path)? {
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
        let version = match read_u32("version")? {
            Ok(v) => v,
            Err(e) => return Ok(Err(e)),
        };
        if version != PROTOCOL_VERSION {
            return Ok(Err(format!(
                "protocol version {version} is not supported; this backend speaks version {PROTOCOL_VERSION}"
            )));
        }
        let ring_ref = match read_u32("ring-ref")? {
            Ok(v) => v,
            Err(e) => return Ok(Err(e)),
        };
        let event_channel = match read_u32("event-channel")? {
            Ok(v) => v,
            Err(e) => return Ok(Err(e)),
        };
        let pid = read_u32("pid")?.ok();
        let mode = match self.store.read_opt(&format!("{fpath}/mode"))? {
            None => ChannelMode::Bypass,
            Some(v) => match v.trim_ascii() {
                b"bypass" | b"" => ChannelMode::Bypass,
                b"mediated" => ChannelMode::Mediated,
                other => {
                    return Ok(Err(format!(
                        "channel/{n}/mode = {:?} is neither \"bypass\" nor \"mediated\"",
                        String::from_utf8_lossy(other)
                    )))
                }
            },
        };
        Ok(Ok(ChannelRequest {
            device: id,
            channel: n,
            ring_ref,
            event_channel,
            version,
            pid,
            mode,
            account: self.devices[&id].account.clone(),
        }))
    }

    /// Answers channel instance `nonce` at index `n` with Closed and an error sentence.
    fn refuse(&mut self, id: DeviceId, n: u32, nonce: Option<&str>, why: &str) -> Result<()> {
        tracing::warn!(device = %id, channel = n, "channel refused: {why}");
        self.finish_close(id, n, nonce, Some(why), false)
    }

    /// Writes the backend channel node's Closed (after Closing when `closing_first`), with
    /// `error` if given (an earlier one is removed otherwise) and the instance's `nonce`, and
    /// records the channel as Closed.
    fn finish_close(
        &mut self,
        id: DeviceId,
        n: u32,
        nonce: Option<&str>,
        error: Option<&str>,
        closing_first: bool,
    ) -> Result<()> {
        let Some(d) = self.devices.get_mut(&id) else {
            return Ok(());
        };
        d.channels
            .insert(n, ChannelRecord::Closed(nonce.map(str::to_owned)));
        let bpath = format!("{}/channel/{n}", d.backend_path);
        let write = |state: XenbusState, error: Option<&str>| {
            self.store.transaction(|t| {
                let err = format!("{bpath}/error");
                match error {
                    Some(why) => t.write(&err, why.as_bytes())?,
                    None if t.exists(&err)? => t.rm(&err)?,
                    None => {}
                }
                write_nonce(t, &bpath, nonce)?;
                t.write(&format!("{bpath}/state"), state.value().as_bytes())
            })
        };
        if closing_first {
            write(XenbusState::Closing, None)?;
        }
        write(XenbusState::Closed, error)
    }

    /// Closes live channel `n` (reclaiming it) if it is live; the record stays for the caller
    /// to update. Returns whether it was live.
    fn close_channel(&mut self, id: DeviceId, n: u32, reason: &CloseReason, log: bool) -> bool {
        let Some(d) = self.devices.get_mut(&id) else {
            return false;
        };
        let nonce = match d.channels.get(&n) {
            Some(ChannelRecord::Live(_, nonce)) => nonce.clone(),
            _ => return false,
        };
        let Some(ChannelRecord::Live(link, _)) = d.channels.insert(n, ChannelRecord::Closed(nonce))
        else {
            return false;
        };
        link.close(reason);
        d.account.refund(Resource::Channels, 1);
        if log {
            tracing::info!(device = %id, channel = n, "channel closed and reclaimed: {reason}");
        } else {
            tracing::info!(device = %id, channel = n, "channel reclaimed: {reason}");
        }
        true
    }

    /// Closes every live channel of a device; with `polite`, each gets Closing then Closed
    /// (and an error naming the reason) in the backend node.
    pub(super) fn close_all_channels(
        &mut self,
        id: DeviceId,
        reason: &CloseReason,
        polite: bool,
    ) -> usize {
        let live: Vec<u32> = self
            .devices
            .get(&id)
            .map(|d| {
                d.channels
                    .iter()
                    .filter(|(_, c)| c.is_live())
                    .map(|(&n, _)| n)
                    .collect()
            })
            .unwrap_or_default();
        for &n in &live {
            self.close_channel(id, n, reason, true);
            if polite {
                let why = (*reason != CloseReason::Frontend).then(|| reason.to_string());
                let nonce = self.record_nonce(id, n);
                if let Err(e) = self.finish_close(id, n, nonce.as_deref(), why.as_deref(), true) {
                    tracing::warn!(device = %id, channel = n, "cannot write the channel's Closed state: {e}");
                }
            }
        }
        live.len()
    }

    /// The nonce of the instance recorded at index `n`.
    fn record_nonce(&self, id: DeviceId, n: u32) -> Nonce {
        self.devices
            .get(&id)
            .and_then(|d| d.channels.get(&n))
            .and_then(|r| r.nonce().map(str::to_owned))
    }

    /// A live channel reported a fault (from its control service, through the daemon).
    pub fn channel_fault(&mut self, id: DeviceId, n: u32, fault: ChannelFault) -> Result<()> {
        match fault {
            ChannelFault::Died => {
                if !self.close_channel(id, n, &CloseReason::ProcessDied, true) {
                    return Ok(());
                }
                let Some(d) = self.devices.get(&id) else {
                    return Ok(());
                };
                let fpath = format!("{}/channel/{n}", d.frontend_path);
                let bpath = format!("{}/channel/{n}", d.backend_path);
                // The process is gone: nobody will remove its node; we may (if privileged).
                match self.store.rm(&fpath).or_else(ignore_enoent) {
                    Ok(()) => {
                        self.store.rm(&bpath).or_else(ignore_enoent)?;
                        if let Some(d) = self.devices.get_mut(&id) {
                            d.channels.remove(&n);
                        }
                        tracing::info!(device = %id, channel = n, "channel nodes removed");
                        Ok(())
                    }
                    Err(e) if e.is_access_denied() => {
                        let nonce = self.record_nonce(id, n);
                        self.finish_close(
                            id,
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
                if !self.close_channel(id, n, &reason, true) {
                    return Ok(());
                }
                let nonce = self.record_nonce(id, n);
                self.finish_close(id, n, nonce.as_deref(), Some(&reason.to_string()), false)
            }
        }
    }
}
