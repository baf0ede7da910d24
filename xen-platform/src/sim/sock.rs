//! Unix `SOCK_SEQPACKET` sockets by path, and the simulated host's directory layout.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};

/// The host's control socket.
pub fn control_socket(dir: &Path) -> PathBuf {
    dir.join("control.sock")
}

/// A domain's folder.
pub fn domain_dir(dir: &Path, domid: u16) -> PathBuf {
    dir.join("domains").join(domid.to_string())
}

/// A domain's hypercall socket (grants, event channels).
pub fn hypercall_socket(dir: &Path, domid: u16) -> PathBuf {
    domain_dir(dir, domid).join("hypercall.sock")
}

/// A domain's XenStore socket (`XENSTORED_PATH`): the host serves a process on it as that domain
/// if the process may act as it (docs/platform.md, "Trust model").
pub fn xenstore_socket(dir: &Path, domid: u16) -> PathBuf {
    domain_dir(dir, domid).join("xenstored.sock")
}

fn addr(path: &Path) -> io::Result<SocketAddrUnix> {
    SocketAddrUnix::new(path).map_err(|e| {
        io::Error::new(
            io::Error::from(e).kind(),
            format!(
                "socket path {} is too long for a Unix socket (keep it under 108 bytes)",
                path.display()
            ),
        )
    })
}

/// Bind and listen on `path` (replacing a stale socket file).
pub fn listen(path: &Path) -> io::Result<OwnedFd> {
    listen_as(path, SocketType::SEQPACKET)
}

/// Bind and listen on `path` with a byte-stream socket (XenStore's transport).
pub fn listen_stream(path: &Path) -> io::Result<OwnedFd> {
    listen_as(path, SocketType::STREAM)
}

fn listen_as(path: &Path, kind: SocketType) -> io::Result<OwnedFd> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let fd = rustix::net::socket_with(AddressFamily::UNIX, kind, SocketFlags::CLOEXEC, None)?;
    rustix::net::bind(&fd, &addr(path)?)?;
    rustix::net::listen(&fd, 128)?;
    Ok(fd)
}

/// Connect to `path`.
pub fn connect(path: &Path) -> io::Result<OwnedFd> {
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?;
    rustix::net::connect(&fd, &addr(path)?)?;
    Ok(fd)
}

/// Accept one connection (retrying on EINTR).
pub fn accept(listener: impl AsFd) -> io::Result<OwnedFd> {
    loop {
        match rustix::net::accept_with(&listener, SocketFlags::CLOEXEC) {
            Err(rustix::io::Errno::INTR) => continue,
            r => return r.map_err(Into::into),
        }
    }
}

/// Wake whoever blocks on `fd` (accept or recv) by shutting the socket down.
pub fn shutdown(fd: impl AsFd) {
    let _ = rustix::net::shutdown(fd, rustix::net::Shutdown::Both);
}

/// A close-on-exec duplicate, kept to shut a socket down from another thread.
pub fn dup(fd: impl AsFd) -> io::Result<OwnedFd> {
    rustix::io::fcntl_dupfd_cloexec(fd, 0).map_err(Into::into)
}
