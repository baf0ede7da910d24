//! Which platform are we on: real Xen, or a simulated Xen host?

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::types::DomId;

/// Environment variable naming the simulated host's directory (`vrdma-simhost serve --dir`).
pub const ENV_SIM_DIR: &str = "VRDMA_SIM";
/// Environment variable naming the simulated domain this process runs in (default 0).
pub const ENV_SIM_DOMID: &str = "VRDMA_SIM_DOMID";

/// The platform a process runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlatformKind {
    /// Real Xen, through `/dev/xen/*`.
    Xen {
        /// True in the control domain (`/proc/xen/capabilities` says `control_d`).
        control_domain: bool,
    },
    /// A simulated Xen host served from `dir`, acting as domain `domid`.
    Sim {
        /// The host's directory.
        dir: PathBuf,
        /// The simulated domain this process belongs to.
        domid: DomId,
    },
}

/// What detection looks at; split out so tests can point it at a fake root.
#[derive(Debug, Clone, Default)]
pub struct Probe {
    /// Value of `VRDMA_SIM`.
    pub sim_dir: Option<OsString>,
    /// Value of `VRDMA_SIM_DOMID`.
    pub sim_domid: Option<OsString>,
    /// Root of the filesystem holding `proc/xen` and `sys/hypervisor/type` (normally `/`).
    pub root: PathBuf,
}

impl Probe {
    /// The real environment of this process.
    pub fn from_env() -> Probe {
        Probe {
            sim_dir: std::env::var_os(ENV_SIM_DIR),
            sim_domid: std::env::var_os(ENV_SIM_DOMID),
            root: PathBuf::from("/"),
        }
    }
}

/// Detect the platform of this process: `VRDMA_SIM` first (an explicit choice wins), then
/// Xen's own signs, else a clear error.
pub fn detect() -> Result<PlatformKind> {
    detect_with(&Probe::from_env())
}

/// [`detect`] over an explicit probe.
pub fn detect_with(p: &Probe) -> Result<PlatformKind> {
    if let Some(dir) = p.sim_dir.as_ref().filter(|d| !d.is_empty()) {
        let domid = match &p.sim_domid {
            None => DomId::DOM0,
            Some(s) => parse_domid(s)?,
        };
        return Ok(PlatformKind::Sim {
            dir: PathBuf::from(dir),
            domid,
        });
    }
    let hv_type_path = p.root.join("sys/hypervisor/type");
    let hv_type = std::fs::read_to_string(&hv_type_path).ok();
    let proc_xen = p.root.join("proc/xen");
    let caps = std::fs::read_to_string(proc_xen.join("capabilities")).ok();
    let is_xen = hv_type.as_deref().map(str::trim) == Some("xen") || proc_xen.is_dir();
    if is_xen {
        return Ok(PlatformKind::Xen {
            control_domain: caps.is_some_and(|c| c.split_whitespace().any(|w| w == "control_d")),
        });
    }
    Err(Error::NoPlatform(format!(
        "{ENV_SIM_DIR} is not set, {} {}, and {} {}; on Xen mount xenfs \
         (`mount -t xenfs xenfs /proc/xen`), elsewhere start `vrdma-simhost serve --dir DIR` \
         and set {ENV_SIM_DIR}=DIR",
        show(&hv_type_path, &p.root),
        match hv_type.as_deref() {
            None => "does not exist".to_string(),
            Some(t) => format!("says {:?}", t.trim()),
        },
        show(&proc_xen, &p.root),
        if proc_xen.exists() {
            "is not a directory"
        } else {
            "does not exist"
        },
    )))
}

fn show(path: &Path, root: &Path) -> String {
    match path.strip_prefix(root) {
        Ok(rel) => format!("/{}", rel.display()),
        Err(_) => path.display().to_string(),
    }
}

fn parse_domid(s: &OsString) -> Result<DomId> {
    let t = s.to_string_lossy();
    match t.trim().parse::<u16>() {
        Ok(v) if DomId(v).is_normal() => Ok(DomId(v)),
        _ => Err(Error::InvalidArgument(format!(
            "{ENV_SIM_DOMID}={t:?} is not a domain id (0..=32751)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(root: &Path) -> Probe {
        Probe {
            sim_dir: None,
            sim_domid: None,
            root: root.to_path_buf(),
        }
    }

    #[test]
    fn nothing_is_a_clear_error() {
        let t = tempfile::tempdir().unwrap();
        let e = detect_with(&probe(t.path())).unwrap_err();
        let s = e.to_string();
        assert!(
            s.contains("VRDMA_SIM") && s.contains("/sys/hypervisor/type"),
            "{s}"
        );
        assert!(s.contains("/proc/xen"), "{s}");
    }

    #[test]
    fn other_hypervisor_is_not_xen() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("sys/hypervisor")).unwrap();
        std::fs::write(t.path().join("sys/hypervisor/type"), "kvm\n").unwrap();
        let s = detect_with(&probe(t.path())).unwrap_err().to_string();
        assert!(s.contains("\"kvm\""), "{s}");
    }

    #[test]
    fn sys_hypervisor_says_xen() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("sys/hypervisor")).unwrap();
        std::fs::write(t.path().join("sys/hypervisor/type"), "xen\n").unwrap();
        assert_eq!(
            detect_with(&probe(t.path())).unwrap(),
            PlatformKind::Xen {
                control_domain: false
            }
        );
    }

    #[test]
    fn proc_xen_control_domain() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("proc/xen")).unwrap();
        std::fs::write(t.path().join("proc/xen/capabilities"), "control_d\n").unwrap();
        assert_eq!(
            detect_with(&probe(t.path())).unwrap(),
            PlatformKind::Xen {
                control_domain: true
            }
        );
    }

    #[test]
    fn sim_wins_over_xen() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("proc/xen")).unwrap();
        let mut p = probe(t.path());
        p.sim_dir = Some("/tmp/simhost".into());
        p.sim_domid = Some("7".into());
        assert_eq!(
            detect_with(&p).unwrap(),
            PlatformKind::Sim {
                dir: "/tmp/simhost".into(),
                domid: DomId(7)
            }
        );
        p.sim_domid = None;
        assert!(matches!(
            detect_with(&p).unwrap(),
            PlatformKind::Sim {
                domid: DomId(0),
                ..
            }
        ));
    }

    #[test]
    fn bad_sim_domid_is_rejected() {
        let t = tempfile::tempdir().unwrap();
        let mut p = probe(t.path());
        p.sim_dir = Some("/tmp/x".into());
        for bad in ["", "x", "65535", "-1", "32752"] {
            p.sim_domid = Some(bad.into());
            match detect_with(&p) {
                Err(Error::InvalidArgument(m)) => {
                    assert!(m.contains("is not a domain id"), "{bad:?}: {m}")
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }
}
