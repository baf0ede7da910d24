//! Where the backend runs: real Xen, a simulated host it is pointed at, or a simulated host it
//! starts itself (the embedded default when there is no Xen and nothing is given).

use std::path::{Path, PathBuf};

use xen_platform::sim::{sock, SimHost, SimHostConfig};
use xen_platform::{Platform, PlatformKind};
use xenstore_proto::client::Client;

/// Which host to use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostChoice {
    /// Real Xen if this is Xen, else an embedded simulated host in a fresh directory.
    Auto,
    /// The simulated host serving `dir` (`vrdma-simhost serve --dir DIR`).
    Sim(PathBuf),
    /// Start a simulated host in `dir` (a fresh directory under the runtime dir if `None`).
    Embedded(Option<PathBuf>),
}

/// Why the host could not be used.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("{what}: {source}")]
    Platform {
        what: String,
        source: xen_platform::Error,
    },
    #[error("cannot create {path}: {source}")]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("backend domain id {0} is not a normal domain")]
    BadDomid(u32),
}

/// A started host: the platform, a XenStore connection as the backend domain, and the
/// simulated host when this process runs it.
pub struct Host {
    pub platform: Platform,
    pub store: Client,
    pub backend_domid: u32,
    /// The embedded simulated host (stops when dropped).
    pub embedded: Option<SimHost>,
    /// One line saying what this is, for the log.
    pub description: String,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host")
            .field("platform", &self.platform.kind())
            .field("backend_domid", &self.backend_domid)
            .field("embedded", &self.embedded.is_some())
            .finish()
    }
}

impl Host {
    /// The simulated host's directory, if this is a simulated host.
    pub fn sim_dir(&self) -> Option<&Path> {
        match self.platform.kind() {
            PlatformKind::Sim { dir, .. } => Some(dir),
            PlatformKind::Xen { .. } => None,
        }
    }
}

fn platform_err(what: impl Into<String>) -> impl FnOnce(xen_platform::Error) -> HostError {
    let what = what.into();
    move |source| HostError::Platform { what, source }
}

/// A fresh directory for an embedded host: `$XDG_RUNTIME_DIR/vrdma-sim-<pid>` or
/// `/tmp/vrdma-sim-<pid>` (short: socket paths must fit in 108 bytes).
pub fn default_embedded_dir() -> PathBuf {
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|p| p.is_dir() && p.as_os_str().len() < 40)
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    base.join(format!("vrdma-sim-{}", std::process::id()))
}

/// Starts (or joins) the host.
pub fn start(choice: HostChoice) -> Result<Host, HostError> {
    let choice = match choice {
        HostChoice::Auto => match xen_platform::detect() {
            Ok(PlatformKind::Sim { dir, .. }) => HostChoice::Sim(dir),
            Ok(kind @ PlatformKind::Xen { .. }) => return open(kind, None, "Xen".into()),
            Err(e) => {
                tracing::info!("no Xen here ({e}); starting an embedded simulated host");
                HostChoice::Embedded(None)
            }
        },
        other => other,
    };
    match choice {
        HostChoice::Auto => unreachable!("resolved above"),
        HostChoice::Sim(dir) => {
            let kind = PlatformKind::Sim {
                dir: dir.clone(),
                domid: xen_platform::DomId::DOM0,
            };
            open(
                kind,
                None,
                format!("simulated Xen host at {}", dir.display()),
            )
        }
        HostChoice::Embedded(dir) => {
            let dir = dir.unwrap_or_else(default_embedded_dir);
            std::fs::create_dir_all(&dir).map_err(|source| HostError::Dir {
                path: dir.clone(),
                source,
            })?;
            let host = SimHost::start(SimHostConfig::new(&dir)).map_err(platform_err(format!(
                "starting a simulated host in {}",
                dir.display()
            )))?;
            let dir = host.dir().to_path_buf();
            let kind = PlatformKind::Sim {
                dir: dir.clone(),
                domid: xen_platform::DomId::DOM0,
            };
            open(
                kind,
                Some(host),
                format!("embedded simulated Xen host at {}", dir.display()),
            )
        }
    }
}

fn open(
    kind: PlatformKind,
    embedded: Option<SimHost>,
    description: String,
) -> Result<Host, HostError> {
    let platform = Platform::open(kind).map_err(platform_err("opening the platform"))?;
    let store = platform
        .xenstore()
        .map_err(platform_err("connecting to XenStore"))?;
    let domid = platform
        .domid()
        .map_err(platform_err("finding the backend's domain id"))?;
    Ok(Host {
        platform,
        store,
        backend_domid: u32::from(domid.0),
        embedded,
        description,
    })
}

/// How other processes join a simulated host: one line per item.
pub fn join_instructions(dir: &Path) -> Vec<String> {
    vec![
        format!("VRDMA_SIM={}", dir.display()),
        format!(
            "host control socket: {}",
            sock::control_socket(dir).display()
        ),
        format!(
            "dom0 XenStore socket: {}",
            sock::xenstore_socket(dir, 0).display()
        ),
        format!(
            "create a guest: vrdma-simhost --dir {} domain create; run in it: vrdma-simhost --dir {} run ID -- COMMAND",
            dir.display(),
            dir.display()
        ),
    ]
}
