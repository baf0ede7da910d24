//! Byte transports to the daemon: the xenstored Unix socket, or the `/dev/xen/xenbus`
//! character device (a guest's path). Both carry the same framing; the device is read through
//! the reactor and written directly, because xenbus never reports itself writable.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

pub(crate) type BoxRead = Box<dyn AsyncRead + Send + Unpin>;
pub(crate) type BoxWrite = Box<dyn AsyncWrite + Send + Unpin>;

/// Environment variable naming the xenstored socket (as libxenstore reads it).
pub const XENSTORED_PATH_ENV: &str = "XENSTORED_PATH";
/// The xenstored socket when [`XENSTORED_PATH_ENV`] is not set.
pub const DEFAULT_SOCKET_PATH: &str = "/run/xenstored/socket";
/// The guest's XenStore character device.
pub const XENBUS_DEVICE_PATH: &str = "/dev/xen/xenbus";

/// The socket path from [`XENSTORED_PATH_ENV`], else [`DEFAULT_SOCKET_PATH`].
pub fn socket_path_from_env() -> std::path::PathBuf {
    std::env::var_os(XENSTORED_PATH_ENV)
        .filter(|p| !p.is_empty())
        .map(Into::into)
        .unwrap_or_else(|| DEFAULT_SOCKET_PATH.into())
}

/// Splits a connected tokio socket into the driver's halves.
pub(crate) fn socket_halves(stream: tokio::net::UnixStream) -> (BoxRead, BoxWrite) {
    let (r, w) = stream.into_split();
    (Box::new(r), Box::new(w))
}

/// Opens the xenbus device read-write and non-blocking.
pub(crate) fn open_xenbus(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
}

/// Wraps an open xenbus device (or any fd with its read/write semantics) for the driver.
/// Must run inside a tokio runtime.
pub(crate) fn xenbus_halves(file: File) -> io::Result<(BoxRead, BoxWrite)> {
    let flags = rustix::fs::fcntl_getfl(file.as_fd())?;
    rustix::fs::fcntl_setfl(file.as_fd(), flags | rustix::fs::OFlags::NONBLOCK)?;
    // Only readable: xenbus's poll never reports writable, writes go straight to the fd.
    // SAFETY: the File is moved into the AsyncFd and owns its descriptor until the AsyncFd is
    // dropped; File::as_raw_fd always returns that same descriptor.
    let fd = unsafe { AsyncFd::register_with_interest(file, Interest::READABLE) }?;
    let fd = Arc::new(fd);
    Ok((
        Box::new(XenbusReader(fd.clone())),
        Box::new(XenbusWriter(fd)),
    ))
}

struct XenbusReader(Arc<AsyncFd<File>>);
struct XenbusWriter(Arc<AsyncFd<File>>);

impl AsyncRead for XenbusReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.0.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match guard.try_io(|fd| fd.get_ref().read(unfilled)) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for XenbusWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.0.get_ref().write(buf) {
            // The device accepts whole messages at once; a full socket standing in for it in
            // tests is simply retried on the next poll.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            other => Poll::Ready(other),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
