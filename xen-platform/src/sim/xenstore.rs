//! The simulated host's XenStore: xenstore-proto's embedded server, one socket per domain
//! carrying that domain's identity (dom0's is privileged; the host accepts on it and admits
//! only that domain's processes), with the nodes and permissions xl creates for a domain,
//! `@introduceDomain` on create and `@releaseDomain` on destroy.

use xenstore_proto::client::Client;
use xenstore_proto::server::{Config, Server};
use xenstore_proto::wire::{Perm, PermKind, Perms};

use crate::error::{Error, Result};
use crate::types::DomId;

pub(crate) struct SimXenStore {
    server: Server,
    dom0: Client,
}

/// The `/vm/<uuid>` path of a simulated domain (a made-up, stable uuid).
pub fn vm_path(domid: DomId) -> String {
    format!("/vm/00000000-0000-0000-0000-{:012x}", domid.0)
}

impl SimXenStore {
    pub(crate) fn new() -> Result<SimXenStore> {
        let server = Server::try_new(Config::default())
            .map_err(|e| Error::SimHost(format!("XenStore server: {e}")))?;
        let stream = server
            .connect(0)
            .map_err(|e| Error::SimHost(format!("XenStore server: {e}")))?;
        let dom0 = Client::from_unix_stream(stream)
            .map_err(|e| Error::SimHost(format!("XenStore dom0 client: {e}")))?;
        Ok(SimXenStore { server, dom0 })
    }

    pub(crate) fn server(&self) -> &Server {
        &self.server
    }

    /// What libxl's `libxl__domain_make` writes, in one transaction: the domain's directory
    /// readable by the domain (`roperm` = n0 r<id>), and the subtrees the domain owns
    /// (`rwperm` = n<id>).
    fn make_domain_nodes(&self, domid: DomId, name: &str) -> xenstore_proto::client::Result<()> {
        let d = u32::from(domid.0);
        let dom_path = format!("/local/domain/{d}");
        let vm = vm_path(domid);
        let roperm = Perms(vec![
            Perm::new(PermKind::None, 0),
            Perm::new(PermKind::Read, d),
        ]);
        let rwperm = Perms(vec![Perm::new(PermKind::None, d)]);
        self.dom0.transaction(|t| {
            if t.exists(&dom_path)? {
                t.rm(&dom_path)?;
            }
            t.mkdir(&dom_path)?;
            t.set_perms(&dom_path, &roperm)?;
            t.mkdir(&vm)?;
            t.set_perms(&vm, &roperm)?;
            t.write(&format!("{vm}/uuid"), &vm["/vm/".len()..])?;
            t.write(&format!("{vm}/name"), name)?;
            for (node, value, perms) in [
                ("vm", vm.as_str(), &roperm),
                ("name", name, &roperm),
                ("domid", &d.to_string(), &roperm),
                ("device", "", &roperm),
                ("control", "", &roperm),
                ("control/shutdown", "", &rwperm),
                ("control/feature-poweroff", "", &rwperm),
                ("control/feature-reboot", "", &rwperm),
                ("control/feature-suspend", "", &rwperm),
                ("control/sysrq", "", &rwperm),
                ("data", "", &rwperm),
                ("drivers", "", &rwperm),
                ("feature", "", &rwperm),
                ("attr", "", &rwperm),
                ("error", "", &rwperm),
                ("memory", "", &roperm),
                ("device/suspend/event-channel", "", &rwperm),
            ] {
                let p = format!("{dom_path}/{node}");
                t.write(&p, value)?;
                t.set_perms(&p, perms)?;
            }
            Ok(())
        })
    }

    /// A domain was created: its nodes, as xl makes them, and `@introduceDomain`.
    pub(crate) fn domain_created(
        &self,
        domid: DomId,
        name: &str,
    ) -> std::result::Result<(), String> {
        if domid == DomId::DOM0 {
            // What xen-init-dom0 writes.
            self.dom0
                .write("/local/domain/0/name", name)
                .and_then(|()| self.dom0.write("/local/domain/0/domid", "0"))
                .map_err(|e| format!("XenStore: {e}"))?;
            return Ok(());
        }
        self.make_domain_nodes(domid, name)
            .map_err(|e| format!("XenStore nodes of domain {domid}: {e}"))?;
        self.server
            .introduce_domain(u32::from(domid.0))
            .map_err(|e| format!("XenStore introduce: {e}"))
    }

    /// Serves an admitted connection to `domid`'s XenStore socket as that domain.
    pub(crate) fn serve(
        &self,
        domid: DomId,
        stream: std::os::unix::net::UnixStream,
    ) -> std::result::Result<(), String> {
        self.server
            .serve_stream(stream, u32::from(domid.0))
            .map_err(|e| e.to_string())
    }

    /// A domain was destroyed (its processes are already killed): its nodes go and
    /// `@releaseDomain` fires; dom0's destruction shuts the server down.
    pub(crate) fn domain_destroyed(&self, domid: DomId) {
        if domid == DomId::DOM0 {
            self.server.shutdown();
            return;
        }
        // As libxl: remove the domain's paths, then the domain dies and xenstored fires
        // @releaseDomain.
        for p in [format!("/local/domain/{}", domid.0), vm_path(domid)] {
            if let Err(e) = self.dom0.rm(&p) {
                if !e.is_not_found() {
                    tracing::warn!("XenStore: rm {p}: {e}");
                }
            }
        }
        if let Err(e) = self.server.release_domain(u32::from(domid.0)) {
            tracing::warn!("XenStore: release domain {domid}: {e}");
        }
    }
}
