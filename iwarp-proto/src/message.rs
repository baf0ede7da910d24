//! One ULPDU read as an RDMAP message: what the receive path calls on every FPDU payload,
//! and how the send path builds the headers in front of its payload.
//!
//! [`MessageRepr::parse`] checks everything that does not need QP state: DDP and RDMAP
//! versions, a known opcode in the buffer model it belongs to (Write and Read Response
//! tagged, the rest untagged), the queue number of untagged opcodes, and the whole
//! single-segment bodies of Read Request and Terminate. MSN order, STag, bounds and access
//! are the data path's (it has the QP). Every error maps to a Terminate code with
//! [`TermCode::for_error`](crate::terminate::TermCode::for_error).

use std::ops::Range;

use crate::ddp::{BufferModel, DdpRepr, Segment, UNTAGGED_HEADER_LEN};
use crate::fpdu::{self, Fpdu};
use crate::rdmap::{self, Opcode, ReadRequest, ReadRequestRepr, READ_REQUEST_LEN};
use crate::terminate::{self, Terminate, TerminateRepr};
use crate::WireError;

/// The most bytes [`MessageRepr::emit_fpdu_head`] writes: the FPDU length field, an untagged
/// DDP header and the longest body (a Terminate quoting an untagged header and a Read
/// Request) — the size of a sender's stack buffer for it.
pub const MAX_FPDU_HEAD_LEN: usize =
    fpdu::HEADER_LEN + UNTAGGED_HEADER_LEN + terminate::MAX_BODY_LEN;

/// What follows the DDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body<'a> {
    /// Payload bytes to place (Write, Read Response, the Sends).
    Data,
    /// An RDMA Read Request header.
    ReadRequest(ReadRequestRepr),
    /// A Terminate message.
    Terminate(TerminateRepr<'a>),
}

/// One DDP segment read as RDMAP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageRepr<'a> {
    pub ddp: DdpRepr,
    pub opcode: Opcode,
    pub body: Body<'a>,
    /// Where the data payload is in the ULPDU (empty, right after the body, for Read Request
    /// and Terminate).
    pub payload: Range<usize>,
}

/// The header of a tagged segment (RDMA Write, Read Response) placing at `stag`/`to`.
pub fn tagged_header(opcode: Opcode, last: bool, stag: u32, to: u64) -> DdpRepr {
    DdpRepr {
        last,
        ulp_ctrl: rdmap::ctrl_byte(opcode),
        model: BufferModel::Tagged { stag, to },
    }
}

/// The header of an untagged segment on its opcode's queue; `invalidate_stag` goes in the
/// RsvdULP field (Send with Invalidate; 0 otherwise).
pub fn untagged_header(
    opcode: Opcode,
    last: bool,
    invalidate_stag: u32,
    msn: u32,
    mo: u32,
) -> DdpRepr {
    DdpRepr {
        last,
        ulp_ctrl: rdmap::ctrl_byte(opcode),
        model: BufferModel::Untagged {
            rsvd_ulp: invalidate_stag,
            qn: opcode.queue().unwrap_or(crate::ddp::QN_SEND),
            msn,
            mo,
        },
    }
}

/// The segment payloads of a message of `len` bytes when a segment carries at most `max`
/// payload bytes (the MULPDU less the DDP header): `(range in the message, last)`, in order.
/// A zero-length message (an RTR, an empty Send) is one empty segment.
pub fn segments(len: usize, max: usize) -> Segments {
    Segments {
        len,
        max: max.max(1),
        next: 0,
        done: false,
    }
}

/// Iterator of [`segments`].
#[derive(Debug, Clone)]
pub struct Segments {
    len: usize,
    max: usize,
    next: usize,
    done: bool,
}

impl Iterator for Segments {
    type Item = (Range<usize>, bool);

    fn next(&mut self) -> Option<(Range<usize>, bool)> {
        if self.done {
            return None;
        }
        let start = self.next;
        let end = start + (self.len - start).min(self.max);
        self.next = end;
        self.done = end == self.len;
        Some((start..end, self.done))
    }
}

impl<'a> MessageRepr<'a> {
    fn outgoing(opcode: Opcode, ddp: DdpRepr, body: Body<'a>) -> MessageRepr<'a> {
        let mut m = MessageRepr {
            ddp,
            opcode,
            body,
            payload: 0..0,
        };
        let end = m.headers_len();
        m.payload = end..end;
        m
    }

    /// A segment of a tagged message (RDMA Write, Read Response) to send: its payload, the
    /// caller's, goes to `stag` at `to`.
    pub fn tagged(opcode: Opcode, last: bool, stag: u32, to: u64) -> MessageRepr<'static> {
        MessageRepr::outgoing(opcode, tagged_header(opcode, last, stag, to), Body::Data)
    }

    /// A segment of an untagged data message (the Sends) to send, on its opcode's queue;
    /// `invalidate_stag` as in [`untagged_header`].
    pub fn untagged(
        opcode: Opcode,
        last: bool,
        invalidate_stag: u32,
        msn: u32,
        mo: u32,
    ) -> MessageRepr<'static> {
        let ddp = untagged_header(opcode, last, invalidate_stag, msn, mo);
        MessageRepr::outgoing(opcode, ddp, Body::Data)
    }

    /// An RDMA Read Request to send: one segment (L, MO 0) on queue 1, message `msn`.
    pub fn read_request(msn: u32, request: ReadRequestRepr) -> MessageRepr<'static> {
        let ddp = untagged_header(Opcode::ReadRequest, true, 0, msn, 0);
        MessageRepr::outgoing(Opcode::ReadRequest, ddp, Body::ReadRequest(request))
    }

    /// A Terminate to send: one segment (L, MO 0) on queue 2, message `msn`.
    pub fn terminate(msn: u32, t: TerminateRepr<'a>) -> MessageRepr<'a> {
        let ddp = untagged_header(Opcode::Terminate, true, 0, msn, 0);
        MessageRepr::outgoing(Opcode::Terminate, ddp, Body::Terminate(t))
    }

    /// Reads a ULPDU (the payload of one FPDU).
    pub fn parse(ulpdu: &'a [u8]) -> Result<MessageRepr<'a>, WireError> {
        let seg = Segment::new_checked(ulpdu)?;
        let ddp = DdpRepr::parse(&seg)?;
        let opcode = rdmap::parse_ctrl(ddp.ulp_ctrl)?;
        let header_len = ddp.header_len();
        if opcode.tagged() != ddp.tagged() {
            return Err(WireError::UnexpectedOpcode {
                opcode: opcode.as_u8(),
                why: if ddp.tagged() {
                    "an untagged opcode in a tagged segment"
                } else {
                    "a tagged opcode in an untagged segment"
                },
            });
        }
        let rest = &ulpdu[header_len..];
        let mut payload = header_len..ulpdu.len();
        let body = match (opcode, ddp.model) {
            (_, BufferModel::Untagged { qn, .. }) if Some(qn) != opcode.queue() => {
                return Err(WireError::InvalidQn { qn });
            }
            (Opcode::ReadRequest, BufferModel::Untagged { mo, .. }) => {
                single_segment(&ddp, mo, "RDMA Read Request")?;
                if rest.len() != READ_REQUEST_LEN {
                    return Err(WireError::Malformed {
                        what: "RDMA Read Request",
                        why: "the segment payload is not the 28-byte header",
                    });
                }
                let end = header_len + READ_REQUEST_LEN;
                payload = end..end;
                Body::ReadRequest(ReadRequestRepr::parse(&ReadRequest::new_checked(rest)?)?)
            }
            (Opcode::Terminate, BufferModel::Untagged { mo, .. }) => {
                single_segment(&ddp, mo, "Terminate")?;
                let t = parse_terminate(rest)?;
                // Bytes after the announced headers are not part of the message.
                let end = header_len + t.buffer_len();
                payload = end..end;
                Body::Terminate(t)
            }
            _ => Body::Data,
        };
        Ok(MessageRepr {
            ddp,
            opcode,
            body,
            payload,
        })
    }

    /// The STag a Send with Invalidate names.
    pub fn invalidate_stag(&self) -> Option<u32> {
        match self.ddp.model {
            BufferModel::Untagged { rsvd_ulp, .. } if self.opcode.invalidates() => Some(rsvd_ulp),
            _ => None,
        }
    }

    /// Bytes of DDP header plus Read Request / Terminate body (what precedes the payload).
    pub fn headers_len(&self) -> usize {
        self.ddp.header_len()
            + match self.body {
                Body::Data => 0,
                Body::ReadRequest(_) => READ_REQUEST_LEN,
                Body::Terminate(t) => t.buffer_len(),
            }
    }

    /// Writes the DDP header and the Read Request / Terminate body at the front of `buf`
    /// (the payload, if any, is the caller's); returns the bytes written.
    pub fn emit_headers(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let need = self.headers_len();
        if buf.len() < need {
            return Err(WireError::Truncated {
                what: "message header buffer",
                need,
                have: buf.len(),
            });
        }
        let h = self.ddp.header_len();
        self.ddp.emit(&mut Segment::new_unchecked(&mut buf[..h]))?;
        match self.body {
            Body::Data => {}
            Body::ReadRequest(r) => r.emit(&mut ReadRequest::new_unchecked(&mut buf[h..need]))?,
            Body::Terminate(t) => t.emit(&mut Terminate::new_unchecked(&mut buf[h..need]))?,
        }
        Ok(need)
    }

    /// Writes the front of the FPDU that carries this message with `payload_len` bytes of
    /// payload after it: `ULPDU_LENGTH`, then what [`MessageRepr::emit_headers`] writes, into
    /// `buf` (at most [`MAX_FPDU_HEAD_LEN`] bytes; no allocation). Returns the bytes written.
    /// The payload, pad and CRC are the sender's: it writes the payload from where it lives
    /// and ends the FPDU with a [`Trailer`](crate::fpdu::Trailer).
    pub fn emit_fpdu_head(&self, payload_len: usize, buf: &mut [u8]) -> Result<usize, WireError> {
        let ulpdu_len = self.headers_len().saturating_add(payload_len);
        let len = u16::try_from(ulpdu_len).map_err(|_| WireError::TooLong {
            what: "FPDU ULPDU",
            len: ulpdu_len,
            max: fpdu::MAX_ULPDU_LEN,
        })?;
        let need = fpdu::HEADER_LEN + self.headers_len();
        if buf.len() < need {
            return Err(WireError::Truncated {
                what: "FPDU head buffer",
                need,
                have: buf.len(),
            });
        }
        Fpdu::new_unchecked(&mut buf[..fpdu::HEADER_LEN]).set_ulpdu_len(len);
        self.emit_headers(&mut buf[fpdu::HEADER_LEN..need])?;
        Ok(need)
    }
}

fn parse_terminate(body: &[u8]) -> Result<TerminateRepr<'_>, WireError> {
    TerminateRepr::parse(&Terminate::new_checked(body)?)
}

/// Read Requests and Terminates are one whole segment: L set, MO 0.
fn single_segment(ddp: &DdpRepr, mo: u32, what: &'static str) -> Result<(), WireError> {
    if !ddp.last || mo != 0 {
        return Err(WireError::Malformed {
            what,
            why: "must be a single segment (L set, MO 0)",
        });
    }
    Ok(())
}
