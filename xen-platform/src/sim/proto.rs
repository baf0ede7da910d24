//! The simulated host's messages: the per-domain hypercall socket (grants, event channels) and
//! the host's control socket (domains, processes). See docs/platform.md for the table.
//!
//! Every message is one `SOCK_SEQPACKET` packet: a little-endian `u16` op, then its fields.
//! Answers are `u8` status 0 + body, or status 1 + [`Failure`]. Descriptors travel as
//! SCM_RIGHTS on the answer (memfds for grants, eventfds for event channels).

use super::wire::{Malformed, Reader, Writer};

/// Most grant references one request may name (keeps a request inside one packet).
pub const MAX_REFS_PER_CALL: usize = 16384;

/// Requests on a domain's hypercall socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Who am I? Answered by [`Reply::Hello`].
    Hello,
    /// Allocate `count` pages granted to `domid`. Answer: [`Reply::Granted`] + memfd.
    GrantAlloc {
        domid: u16,
        writable: bool,
        count: u32,
    },
    /// Release an allocation.
    GrantDealloc { handle: u64 },
    /// Set the unmap-notify of an allocation (`offset` is the byte to clear, if asked).
    GrantNotify {
        handle: u64,
        action: u32,
        offset: u64,
        port: u32,
    },
    /// Map `refs` of `domid`. Answer: [`Reply::Mapped`] + one descriptor per segment file.
    Map {
        domid: u16,
        writable: bool,
        refs: Vec<u32>,
    },
    /// Release a mapping.
    Unmap { handle: u64 },
    /// Set the unmap-notify of a mapping.
    MapNotify {
        handle: u64,
        action: u32,
        offset: u64,
        port: u32,
    },
    /// Allocate an unbound port for `remote`. Answer: [`Reply::Port`] + (receive, send) eventfds.
    EvtchnAllocUnbound { remote: u16 },
    /// Bind to `remote`'s unbound port. Answer: [`Reply::Port`] + (receive, send) eventfds.
    EvtchnBind { remote: u16, remote_port: u32 },
    /// Close a port.
    EvtchnUnbind { port: u32 },
}

/// One piece of a mapping: `pages` pages of descriptor `fd_index` from page `file_page`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub fd_index: u32,
    pub file_page: u64,
    pub pages: u32,
}

/// Successful answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Nothing to say.
    Done,
    /// Answer to [`Request::Hello`].
    Hello { domid: u16, max_grants: u32 },
    /// Answer to [`Request::GrantAlloc`].
    Granted { handle: u64, grefs: Vec<u32> },
    /// Answer to [`Request::Map`].
    Mapped { handle: u64, segments: Vec<Segment> },
    /// Answer to the event-channel binds.
    Port { port: u32 },
}

/// A refused request: an errno, the limit involved (for `ENOSPC`), and a sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub errno: i32,
    pub limit: u32,
    pub message: String,
}

impl Failure {
    pub fn new(errno: i32, message: impl Into<String>) -> Failure {
        Failure {
            errno,
            limit: 0,
            message: message.into(),
        }
    }
}

mod op {
    pub const HELLO: u16 = 1;
    pub const GRANT_ALLOC: u16 = 2;
    pub const GRANT_DEALLOC: u16 = 3;
    pub const GRANT_NOTIFY: u16 = 4;
    pub const MAP: u16 = 5;
    pub const UNMAP: u16 = 6;
    pub const MAP_NOTIFY: u16 = 7;
    pub const EVTCHN_ALLOC_UNBOUND: u16 = 8;
    pub const EVTCHN_BIND: u16 = 9;
    pub const EVTCHN_UNBIND: u16 = 10;

    pub const R_DONE: u8 = 0;
    pub const R_HELLO: u8 = 1;
    pub const R_GRANTED: u8 = 2;
    pub const R_MAPPED: u8 = 3;
    pub const R_PORT: u8 = 4;

    pub const C_CREATE: u16 = 101;
    pub const C_DESTROY: u16 = 102;
    pub const C_LIST: u16 = 103;
    pub const C_ADOPT: u16 = 104;
}

impl Request {
    pub fn emit(&self) -> Vec<u8> {
        let mut w = Writer::default();
        match self {
            Request::Hello => {
                w.u16(op::HELLO);
            }
            Request::GrantAlloc {
                domid,
                writable,
                count,
            } => {
                w.u16(op::GRANT_ALLOC)
                    .u16(*domid)
                    .bool(*writable)
                    .u32(*count);
            }
            Request::GrantDealloc { handle } => {
                w.u16(op::GRANT_DEALLOC).u64(*handle);
            }
            Request::GrantNotify {
                handle,
                action,
                offset,
                port,
            } => {
                w.u16(op::GRANT_NOTIFY)
                    .u64(*handle)
                    .u32(*action)
                    .u64(*offset)
                    .u32(*port);
            }
            Request::Map {
                domid,
                writable,
                refs,
            } => {
                w.u16(op::MAP)
                    .u16(*domid)
                    .bool(*writable)
                    .u32(refs.len() as u32);
                for r in refs {
                    w.u32(*r);
                }
            }
            Request::Unmap { handle } => {
                w.u16(op::UNMAP).u64(*handle);
            }
            Request::MapNotify {
                handle,
                action,
                offset,
                port,
            } => {
                w.u16(op::MAP_NOTIFY)
                    .u64(*handle)
                    .u32(*action)
                    .u64(*offset)
                    .u32(*port);
            }
            Request::EvtchnAllocUnbound { remote } => {
                w.u16(op::EVTCHN_ALLOC_UNBOUND).u16(*remote);
            }
            Request::EvtchnBind {
                remote,
                remote_port,
            } => {
                w.u16(op::EVTCHN_BIND).u16(*remote).u32(*remote_port);
            }
            Request::EvtchnUnbind { port } => {
                w.u16(op::EVTCHN_UNBIND).u32(*port);
            }
        }
        w.buf
    }

    pub fn parse(buf: &[u8]) -> Result<Request, Malformed> {
        let mut r = Reader::new(buf);
        let req = match r.u16("op")? {
            op::HELLO => Request::Hello,
            op::GRANT_ALLOC => Request::GrantAlloc {
                domid: r.u16("domid")?,
                writable: r.bool("writable")?,
                count: r.u32("count")?,
            },
            op::GRANT_DEALLOC => Request::GrantDealloc {
                handle: r.u64("handle")?,
            },
            op::GRANT_NOTIFY => Request::GrantNotify {
                handle: r.u64("handle")?,
                action: r.u32("action")?,
                offset: r.u64("offset")?,
                port: r.u32("port")?,
            },
            op::MAP => {
                let domid = r.u16("domid")?;
                let writable = r.bool("writable")?;
                let n = r.count("ref count", MAX_REFS_PER_CALL, 4)?;
                let refs = (0..n).map(|_| r.u32("ref")).collect::<Result<_, _>>()?;
                Request::Map {
                    domid,
                    writable,
                    refs,
                }
            }
            op::UNMAP => Request::Unmap {
                handle: r.u64("handle")?,
            },
            op::MAP_NOTIFY => Request::MapNotify {
                handle: r.u64("handle")?,
                action: r.u32("action")?,
                offset: r.u64("offset")?,
                port: r.u32("port")?,
            },
            op::EVTCHN_ALLOC_UNBOUND => Request::EvtchnAllocUnbound {
                remote: r.u16("remote")?,
            },
            op::EVTCHN_BIND => Request::EvtchnBind {
                remote: r.u16("remote")?,
                remote_port: r.u32("remote port")?,
            },
            op::EVTCHN_UNBIND => Request::EvtchnUnbind {
                port: r.u32("port")?,
            },
            other => return Err(Malformed(format!("unknown op {other}"))),
        };
        r.finish("request")?;
        Ok(req)
    }
}

/// Encode an answer.
pub fn emit_answer(a: &Result<Reply, Failure>) -> Vec<u8> {
    let mut w = Writer::default();
    match a {
        Err(f) => {
            w.u8(1).i32(f.errno).u32(f.limit).str(&f.message);
        }
        Ok(rep) => {
            w.u8(0);
            match rep {
                Reply::Done => {
                    w.u8(op::R_DONE);
                }
                Reply::Hello { domid, max_grants } => {
                    w.u8(op::R_HELLO).u16(*domid).u32(*max_grants);
                }
                Reply::Granted { handle, grefs } => {
                    w.u8(op::R_GRANTED).u64(*handle).u32(grefs.len() as u32);
                    for g in grefs {
                        w.u32(*g);
                    }
                }
                Reply::Mapped { handle, segments } => {
                    w.u8(op::R_MAPPED).u64(*handle).u32(segments.len() as u32);
                    for s in segments {
                        w.u32(s.fd_index).u64(s.file_page).u32(s.pages);
                    }
                }
                Reply::Port { port } => {
                    w.u8(op::R_PORT).u32(*port);
                }
            }
        }
    }
    w.buf
}

/// Decode an answer.
pub fn parse_answer(buf: &[u8]) -> Result<Result<Reply, Failure>, Malformed> {
    let mut r = Reader::new(buf);
    let a = match r.u8("status")? {
        1 => Err(Failure {
            errno: r.i32("errno")?,
            limit: r.u32("limit")?,
            message: r.str("message")?,
        }),
        0 => Ok(match r.u8("reply kind")? {
            op::R_DONE => Reply::Done,
            op::R_HELLO => Reply::Hello {
                domid: r.u16("domid")?,
                max_grants: r.u32("max grants")?,
            },
            op::R_GRANTED => {
                let handle = r.u64("handle")?;
                let n = r.count("gref count", MAX_REFS_PER_CALL, 4)?;
                let grefs = (0..n).map(|_| r.u32("gref")).collect::<Result<_, _>>()?;
                Reply::Granted { handle, grefs }
            }
            op::R_MAPPED => {
                let handle = r.u64("handle")?;
                let n = r.count("segment count", MAX_REFS_PER_CALL, 16)?;
                let segments = (0..n)
                    .map(|_| {
                        Ok(Segment {
                            fd_index: r.u32("fd index")?,
                            file_page: r.u64("file page")?,
                            pages: r.u32("pages")?,
                        })
                    })
                    .collect::<Result<_, Malformed>>()?;
                Reply::Mapped { handle, segments }
            }
            op::R_PORT => Reply::Port {
                port: r.u32("port")?,
            },
            k => return Err(Malformed(format!("unknown reply kind {k}"))),
        }),
        s => return Err(Malformed(format!("unknown status {s}"))),
    };
    r.finish("answer")?;
    Ok(a)
}

/// Requests on the host's control socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// Create a domain. Answer: [`ControlReply::Created`].
    Create { name: String, max_grants: u32 },
    /// Destroy a domain: kill its processes, release everything it held.
    Destroy { domid: u16 },
    /// List domains. Answer: [`ControlReply::Domains`].
    List,
    /// Put process group `pid` (a child of the caller, not yet reaped) into `domid`: it is killed
    /// when the domain is destroyed. The caller keeps this connection open while it lives.
    Adopt { domid: u16, pid: u32 },
}

/// One row of `domain list`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainInfo {
    pub domid: u16,
    pub name: String,
    pub max_grants: u32,
    pub grants: u32,
    pub mappings: u32,
    pub ports: u32,
    pub connections: u32,
    pub processes: u32,
}

/// Successful control answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlReply {
    Done,
    Created { domid: u16 },
    Domains(Vec<DomainInfo>),
}

impl Control {
    pub fn emit(&self) -> Vec<u8> {
        let mut w = Writer::default();
        match self {
            Control::Create { name, max_grants } => {
                w.u16(op::C_CREATE).str(name).u32(*max_grants);
            }
            Control::Destroy { domid } => {
                w.u16(op::C_DESTROY).u16(*domid);
            }
            Control::List => {
                w.u16(op::C_LIST);
            }
            Control::Adopt { domid, pid } => {
                w.u16(op::C_ADOPT).u16(*domid).u32(*pid);
            }
        }
        w.buf
    }

    pub fn parse(buf: &[u8]) -> Result<Control, Malformed> {
        let mut r = Reader::new(buf);
        let c = match r.u16("op")? {
            op::C_CREATE => Control::Create {
                name: r.str("name")?,
                max_grants: r.u32("max grants")?,
            },
            op::C_DESTROY => Control::Destroy {
                domid: r.u16("domid")?,
            },
            op::C_LIST => Control::List,
            op::C_ADOPT => Control::Adopt {
                domid: r.u16("domid")?,
                pid: r.u32("pid")?,
            },
            other => return Err(Malformed(format!("unknown control op {other}"))),
        };
        r.finish("control request")?;
        Ok(c)
    }
}

pub fn emit_control_answer(a: &Result<ControlReply, Failure>) -> Vec<u8> {
    let mut w = Writer::default();
    match a {
        Err(f) => {
            w.u8(1).i32(f.errno).u32(f.limit).str(&f.message);
        }
        Ok(ControlReply::Done) => {
            w.u8(0).u8(0);
        }
        Ok(ControlReply::Created { domid }) => {
            w.u8(0).u8(1).u16(*domid);
        }
        Ok(ControlReply::Domains(ds)) => {
            w.u8(0).u8(2).u32(ds.len() as u32);
            for d in ds {
                w.u16(d.domid)
                    .str(&d.name)
                    .u32(d.max_grants)
                    .u32(d.grants)
                    .u32(d.mappings)
                    .u32(d.ports)
                    .u32(d.connections)
                    .u32(d.processes);
            }
        }
    }
    w.buf
}

pub fn parse_control_answer(buf: &[u8]) -> Result<Result<ControlReply, Failure>, Malformed> {
    let mut r = Reader::new(buf);
    let a = match r.u8("status")? {
        1 => Err(Failure {
            errno: r.i32("errno")?,
            limit: r.u32("limit")?,
            message: r.str("message")?,
        }),
        0 => Ok(match r.u8("kind")? {
            0 => ControlReply::Done,
            1 => ControlReply::Created {
                domid: r.u16("domid")?,
            },
            2 => {
                let n = r.count("domains", 65536, 28)?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(DomainInfo {
                        domid: r.u16("domid")?,
                        name: r.str("name")?,
                        max_grants: r.u32("max grants")?,
                        grants: r.u32("grants")?,
                        mappings: r.u32("mappings")?,
                        ports: r.u32("ports")?,
                        connections: r.u32("connections")?,
                        processes: r.u32("processes")?,
                    });
                }
                ControlReply::Domains(v)
            }
            k => return Err(Malformed(format!("unknown control reply {k}"))),
        }),
        s => return Err(Malformed(format!("unknown status {s}"))),
    };
    r.finish("control answer")?;
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn requests_round_trip() {
        let reqs = vec![
            Request::Hello,
            Request::GrantAlloc {
                domid: 3,
                writable: true,
                count: 9,
            },
            Request::GrantDealloc { handle: 77 },
            Request::GrantNotify {
                handle: 1,
                action: 3,
                offset: 4095,
                port: 8,
            },
            Request::Map {
                domid: 0,
                writable: false,
                refs: vec![8, 9, 10],
            },
            Request::Unmap { handle: 2 },
            Request::MapNotify {
                handle: 2,
                action: 1,
                offset: 0,
                port: 0,
            },
            Request::EvtchnAllocUnbound { remote: 5 },
            Request::EvtchnBind {
                remote: 5,
                remote_port: 1,
            },
            Request::EvtchnUnbind { port: 1 },
        ];
        for q in reqs {
            assert_eq!(Request::parse(&q.emit()).unwrap(), q);
        }
    }

    #[test]
    fn literal_bytes() {
        // op 2 (GrantAlloc), domid 3, writable, count 2 — little-endian.
        let bytes = [2, 0, 3, 0, 1, 2, 0, 0, 0];
        let q = Request::parse(&bytes).unwrap();
        assert_eq!(
            q,
            Request::GrantAlloc {
                domid: 3,
                writable: true,
                count: 2
            }
        );
        assert_eq!(q.emit(), bytes);
    }

    #[test]
    fn answers_round_trip() {
        let answers = vec![
            Ok(Reply::Done),
            Ok(Reply::Hello {
                domid: 4,
                max_grants: 100,
            }),
            Ok(Reply::Granted {
                handle: 5,
                grefs: vec![8, 9],
            }),
            Ok(Reply::Mapped {
                handle: 6,
                segments: vec![Segment {
                    fd_index: 0,
                    file_page: 2,
                    pages: 3,
                }],
            }),
            Ok(Reply::Port { port: 3 }),
            Err(Failure {
                errno: 28,
                limit: 64,
                message: "full".into(),
            }),
        ];
        for a in answers {
            assert_eq!(parse_answer(&emit_answer(&a)).unwrap(), a);
        }
    }

    #[test]
    fn control_round_trips() {
        for c in [
            Control::Create {
                name: "guest".into(),
                max_grants: 10,
            },
            Control::Destroy { domid: 3 },
            Control::List,
            Control::Adopt {
                domid: 1,
                pid: 1234,
            },
        ] {
            assert_eq!(Control::parse(&c.emit()).unwrap(), c);
        }
        let a = Ok(ControlReply::Domains(vec![DomainInfo {
            domid: 1,
            name: "x".into(),
            max_grants: 2,
            grants: 3,
            mappings: 4,
            ports: 5,
            connections: 6,
            processes: 7,
        }]));
        assert_eq!(parse_control_answer(&emit_control_answer(&a)).unwrap(), a);
    }

    #[test]
    fn oversized_ref_count_is_rejected() {
        let mut w = Writer::default();
        w.u16(op::MAP).u16(1).bool(true).u32(u32::MAX);
        assert_eq!(
            Request::parse(&w.buf),
            Err(Malformed("ref count: count 4294967295 too large".into()))
        );
    }

    proptest! {
        #[test]
        fn parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            let _ = Request::parse(&bytes);
            let _ = parse_answer(&bytes);
            let _ = Control::parse(&bytes);
            let _ = parse_control_answer(&bytes);
        }
    }
}
