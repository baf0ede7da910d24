//! Reply payloads, server → client, including `ERROR` and the unsolicited `WATCH_EVENT`.

use super::strings::{exact, number, put, split_strings, utf8};
use super::{MsgType, Perm, Perms, WireError, XsErrno};

/// One chunk of a `DIRECTORY_PART` listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectoryPart<'a> {
    /// The node's generation count: equal across chunks means the node did not change.
    pub generation: u64,
    /// Children names in this chunk.
    pub children: Vec<&'a str>,
    /// The chunk ends the list (the server appended the empty end marker).
    pub complete: bool,
}

/// A `GET_QUOTA` reply: the supported quota names, or one quota's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuotaReply<'a> {
    Names(Vec<&'a str>),
    Value(u32),
}

/// A reply's meaning. Strings borrow from the payload they were parsed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response<'a> {
    /// `OK|`, the reply of every request without a specific reply payload.
    Ok(MsgType),
    /// `<value|>`
    Read(&'a [u8]),
    /// `<child-leaf-name>|*`
    Directory(Vec<&'a str>),
    /// `<gencnt>|<child-leaf-name>|*` (plus an empty string on the last chunk)
    DirectoryPart(DirectoryPart<'a>),
    /// `<perm-as-string>|+`
    GetPerms(Perms),
    /// `<transid>|`
    TransactionStart(u32),
    /// `<path>|`
    GetDomainPath(&'a str),
    /// `T|` or `F|`
    IsDomainIntroduced(bool),
    /// `<value>|`
    GetFeature(u32),
    /// Quota names (space separated) or a decimal value, nul-terminated.
    GetQuota(QuotaReply<'a>),
    /// Implementation-specific output of a `CONTROL` command.
    Control(&'a [u8]),
    /// `<epath>|<token>|`, unsolicited, with `req_id` and `tx_id` 0.
    WatchEvent { path: &'a str, token: &'a str },
    /// `E<something>|`
    Error(XsErrno),
}

/// Types whose success reply is `OK|`.
fn replies_ok(ty: MsgType) -> bool {
    matches!(
        ty,
        MsgType::Watch
            | MsgType::Unwatch
            | MsgType::TransactionEnd
            | MsgType::Introduce
            | MsgType::Release
            | MsgType::Write
            | MsgType::Mkdir
            | MsgType::Rm
            | MsgType::SetPerms
            | MsgType::Resume
            | MsgType::SetTarget
            | MsgType::ResetWatches
            | MsgType::SetFeature
            | MsgType::SetQuota
    )
}

impl<'a> Response<'a> {
    /// Parses the payload of a reply whose header carries type `ty`.
    pub fn parse(ty: MsgType, payload: &'a [u8]) -> Result<Response<'a>, WireError> {
        let bad = |why| WireError::BadReply { ty, why };
        if replies_ok(ty) {
            return match payload {
                b"OK\0" => Ok(Response::Ok(ty)),
                _ => Err(bad("expected OK")),
            };
        }
        Ok(match ty {
            MsgType::Read => Response::Read(payload),
            MsgType::Control => Response::Control(payload),
            MsgType::Directory => Response::Directory(
                split_strings(ty, payload)?
                    .into_iter()
                    .map(|c| utf8(ty, c))
                    .collect::<Result<_, _>>()?,
            ),
            MsgType::DirectoryPart => {
                let parts = split_strings(ty, payload)?;
                let (generation, rest) = parts.split_first().ok_or(bad("no generation"))?;
                let generation = number(ty, generation)?;
                let (complete, names) = match rest.split_last() {
                    Some((&[], names)) => (true, names),
                    _ => (false, rest),
                };
                let children = names
                    .iter()
                    .map(|c| utf8(ty, c))
                    .collect::<Result<Vec<_>, _>>()?;
                if children.iter().any(|c| c.is_empty()) {
                    return Err(bad("empty child name"));
                }
                Response::DirectoryPart(DirectoryPart {
                    generation,
                    children,
                    complete,
                })
            }
            MsgType::GetPerms => {
                let parts = split_strings(ty, payload)?;
                if parts.is_empty() {
                    return Err(bad("no permissions"));
                }
                Response::GetPerms(Perms(
                    parts
                        .iter()
                        .map(|p| Perm::parse(utf8(ty, p)?))
                        .collect::<Result<_, _>>()?,
                ))
            }
            MsgType::TransactionStart => {
                let [id] = exact::<1>(ty, payload, "1")?;
                Response::TransactionStart(number(ty, id)?)
            }
            MsgType::GetDomainPath => {
                let [path] = exact::<1>(ty, payload, "1")?;
                Response::GetDomainPath(utf8(ty, path)?)
            }
            MsgType::IsDomainIntroduced => match payload {
                b"T\0" => Response::IsDomainIntroduced(true),
                b"F\0" => Response::IsDomainIntroduced(false),
                _ => return Err(bad("expected T or F")),
            },
            MsgType::GetFeature => {
                let [value] = exact::<1>(ty, payload, "1")?;
                Response::GetFeature(number(ty, value)?)
            }
            MsgType::GetQuota => {
                let [text] = exact::<1>(ty, payload, "1")?;
                if !text.is_empty() && text.iter().all(u8::is_ascii_digit) {
                    Response::GetQuota(QuotaReply::Value(number(ty, text)?))
                } else {
                    let names: Vec<&str> = utf8(ty, text)?.split_whitespace().collect();
                    // A numeric name would read back as a value: quota names never are.
                    if names.iter().any(|n| n.bytes().all(|b| b.is_ascii_digit())) {
                        return Err(bad("numeric quota name"));
                    }
                    Response::GetQuota(QuotaReply::Names(names))
                }
            }
            MsgType::WatchEvent => {
                let [path, token] = exact::<2>(ty, payload, "2")?;
                Response::WatchEvent {
                    path: utf8(ty, path)?,
                    token: utf8(ty, token)?,
                }
            }
            MsgType::Error => {
                let [name] = exact::<1>(ty, payload, "1")?;
                Response::Error(XsErrno::from_name(utf8(ty, name)?)?)
            }
            // Every remaining type replies OK and was handled above.
            _ => return Err(bad("unexpected reply type")),
        })
    }

    /// The message type the reply is sent as.
    pub fn msg_type(&self) -> MsgType {
        match self {
            Response::Ok(ty) => *ty,
            Response::Read(_) => MsgType::Read,
            Response::Directory(_) => MsgType::Directory,
            Response::DirectoryPart(_) => MsgType::DirectoryPart,
            Response::GetPerms(_) => MsgType::GetPerms,
            Response::TransactionStart(_) => MsgType::TransactionStart,
            Response::GetDomainPath(_) => MsgType::GetDomainPath,
            Response::IsDomainIntroduced(_) => MsgType::IsDomainIntroduced,
            Response::GetFeature(_) => MsgType::GetFeature,
            Response::GetQuota(_) => MsgType::GetQuota,
            Response::Control(_) => MsgType::Control,
            Response::WatchEvent { .. } => MsgType::WatchEvent,
            Response::Error(_) => MsgType::Error,
        }
    }

    /// Appends the payload bytes, as xenstored sends them.
    pub fn emit(&self, out: &mut Vec<u8>) {
        match self {
            Response::Ok(_) => put(out, b"OK"),
            Response::Read(value) | Response::Control(value) => out.extend_from_slice(value),
            Response::Directory(children) => children.iter().for_each(|c| put(out, c.as_bytes())),
            Response::DirectoryPart(part) => {
                put(out, part.generation.to_string().as_bytes());
                part.children.iter().for_each(|c| put(out, c.as_bytes()));
                if part.complete {
                    put(out, b"");
                }
            }
            Response::GetPerms(perms) => perms
                .0
                .iter()
                .for_each(|p| put(out, p.to_string().as_bytes())),
            Response::TransactionStart(id) => put(out, id.to_string().as_bytes()),
            Response::GetDomainPath(path) => put(out, path.as_bytes()),
            Response::IsDomainIntroduced(yes) => put(out, if *yes { b"T" } else { b"F" }),
            Response::GetFeature(value) => put(out, value.to_string().as_bytes()),
            Response::GetQuota(QuotaReply::Value(value)) => put(out, value.to_string().as_bytes()),
            Response::GetQuota(QuotaReply::Names(names)) => put(out, names.join(" ").as_bytes()),
            Response::WatchEvent { path, token } => {
                put(out, path.as_bytes());
                put(out, token.as_bytes());
            }
            Response::Error(errno) => put(out, errno.name().as_bytes()),
        }
    }

    /// The payload as a fresh buffer.
    pub fn to_payload(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.emit(&mut out);
        out
    }

    /// The whole framed message.
    pub fn to_frame(&self, req_id: u32, tx_id: u32) -> Result<Vec<u8>, WireError> {
        super::encode_frame(self.msg_type(), req_id, tx_id, &self.to_payload())
    }
}
