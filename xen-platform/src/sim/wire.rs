//! Byte-level helpers for the simulated host's messages: a checked reader, a writer, and
//! `SOCK_SEQPACKET` send/receive with file descriptors (SCM_RIGHTS).
//!
//! Sequenced packets keep message boundaries and tie passed descriptors to their message, so a
//! message is one `sendmsg` and one `recvmsg`; a truncated message is an error, never a partial
//! parse.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

/// Largest message either side accepts.
pub const MAX_MESSAGE: usize = 128 * 1024;
/// Most descriptors one message carries (Linux's `SCM_MAX_FD` is 253).
pub const MAX_FDS: usize = 253;

/// A parse failure: what was being read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed message: {0}")]
pub struct Malformed(pub String);

/// Checked little-endian reader over one message.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], Malformed> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| Malformed(format!("{what}: message ends at byte {}", self.buf.len())))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    pub fn u8(&mut self, what: &str) -> Result<u8, Malformed> {
        Ok(self.take(1, what)?[0])
    }

    pub fn u16(&mut self, what: &str) -> Result<u16, Malformed> {
        Ok(u16::from_le_bytes(
            self.take(2, what)?.try_into().expect("2"),
        ))
    }

    pub fn u32(&mut self, what: &str) -> Result<u32, Malformed> {
        Ok(u32::from_le_bytes(
            self.take(4, what)?.try_into().expect("4"),
        ))
    }

    pub fn i32(&mut self, what: &str) -> Result<i32, Malformed> {
        Ok(i32::from_le_bytes(
            self.take(4, what)?.try_into().expect("4"),
        ))
    }

    pub fn u64(&mut self, what: &str) -> Result<u64, Malformed> {
        Ok(u64::from_le_bytes(
            self.take(8, what)?.try_into().expect("8"),
        ))
    }

    pub fn bool(&mut self, what: &str) -> Result<bool, Malformed> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(Malformed(format!("{what}: {v} is not a boolean"))),
        }
    }

    /// A u32 count, checked against `max` and against the bytes left (`elem` bytes each).
    pub fn count(&mut self, what: &str, max: usize, elem: usize) -> Result<usize, Malformed> {
        let n = self.u32(what)? as usize;
        if n > max || n.saturating_mul(elem) > self.buf.len() - self.pos {
            return Err(Malformed(format!("{what}: count {n} too large")));
        }
        Ok(n)
    }

    /// A u16-length-prefixed UTF-8 string.
    pub fn str(&mut self, what: &str) -> Result<String, Malformed> {
        let n = self.u16(what)? as usize;
        let b = self.take(n, what)?;
        String::from_utf8(b.to_vec()).map_err(|_| Malformed(format!("{what}: not UTF-8")))
    }

    /// Every byte was consumed.
    pub fn finish(&self, what: &str) -> Result<(), Malformed> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(Malformed(format!(
                "{what}: {} trailing byte(s)",
                self.buf.len() - self.pos
            )))
        }
    }
}

/// Little-endian writer.
#[derive(Default)]
pub struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn bool(&mut self, v: bool) -> &mut Self {
        self.u8(v as u8)
    }
    /// Strings longer than 65535 bytes are cut (they are names and messages).
    pub fn str(&mut self, s: &str) -> &mut Self {
        let mut end = s.len().min(u16::MAX as usize);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.u16(end as u16);
        self.buf.extend_from_slice(&s.as_bytes()[..end]);
        self
    }
}

/// Send one message with `fds` attached.
pub fn send(sock: impl AsFd, msg: &[u8], fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
    if msg.len() > MAX_MESSAGE || fds.len() > MAX_FDS {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "message or descriptor list too large",
        ));
    }
    let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(std::io::Error::other("control buffer too small"));
    }
    let n = rustix::net::sendmsg(
        sock,
        &[IoSlice::new(msg)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    if n != msg.len() {
        return Err(std::io::Error::other("short send on a seqpacket socket"));
    }
    Ok(())
}

/// What [`recv`] got.
#[derive(Debug)]
pub enum Received {
    /// One whole message and its descriptors.
    Message(Vec<u8>, Vec<OwnedFd>),
    /// The peer hung up.
    Closed,
}

/// Receive one message. A message cut short (too long, or with descriptors dropped) is an error;
/// any descriptors that did arrive are closed.
pub fn recv(sock: impl AsFd) -> std::io::Result<Received> {
    let mut buf = vec![0u8; MAX_MESSAGE];
    let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let r = loop {
        match rustix::net::recvmsg(
            &sock,
            &mut [IoSliceMut::new(&mut buf)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Err(rustix::io::Errno::INTR) => continue,
            other => break other?,
        }
    };
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(iter) = m {
            fds.extend(iter);
        }
    }
    if r.flags.contains(ReturnFlags::TRUNC) || r.flags.contains(ReturnFlags::CTRUNC) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "message truncated (too long or too many descriptors)",
        ));
    }
    if r.bytes == 0 && fds.is_empty() {
        return Ok(Received::Closed);
    }
    buf.truncate(r.bytes);
    Ok(Received::Message(buf, fds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rustix::net::{AddressFamily, SocketFlags, SocketType};

    fn pair() -> (OwnedFd, OwnedFd) {
        rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap()
    }

    #[test]
    fn message_with_fds_round_trips() {
        let (a, b) = pair();
        let ev = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
        send(&a, b"hello", &[ev.as_fd()]).unwrap();
        match recv(&b).unwrap() {
            Received::Message(m, fds) => {
                assert_eq!(m, b"hello");
                assert_eq!(fds.len(), 1);
                rustix::io::write(&fds[0], &1u64.to_ne_bytes()).unwrap();
                let mut v = [0u8; 8];
                rustix::io::read(&ev, &mut v).unwrap();
                assert_eq!(u64::from_ne_bytes(v), 1, "received fd is the same eventfd");
            }
            Received::Closed => panic!("closed"),
        }
        drop(a);
        assert!(matches!(recv(&b).unwrap(), Received::Closed));
    }

    #[test]
    fn reader_rejects_short_and_trailing() {
        let mut r = Reader::new(&[1, 0]);
        assert_eq!(
            r.u32("x"),
            Err(Malformed("x: message ends at byte 2".into()))
        );
        let mut r = Reader::new(&[1, 0, 0]);
        r.u16("a").unwrap();
        assert_eq!(
            r.finish("m"),
            Err(Malformed("m: 1 trailing byte(s)".into()))
        );
        let mut r = Reader::new(&[2]);
        assert_eq!(r.bool("b"), Err(Malformed("b: 2 is not a boolean".into())));
        let mut r = Reader::new(&[0xff, 0xff, 0xff, 0xff]);
        assert_eq!(
            r.count("n", 10, 4),
            Err(Malformed("n: count 4294967295 too large".into()))
        );
    }

    #[test]
    fn strings_round_trip() {
        let mut w = Writer::default();
        w.str("grüße").u8(7);
        let mut r = Reader::new(&w.buf);
        assert_eq!(r.str("s").unwrap(), "grüße");
        assert_eq!(r.u8("b").unwrap(), 7);
        r.finish("m").unwrap();
    }

    proptest! {
        #[test]
        fn reader_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut r = Reader::new(&bytes);
            let _ = r.count("n", 1000, 4);
            let _ = r.str("s");
            let _ = r.u64("u");
            let _ = r.finish("m");
        }
    }
}
