//! Request payloads, client → server (docs/misc/xenstore.txt, "payload syntax").

use super::strings::{exact, number, put, split_first, split_strings, utf8};
use super::{check_path, check_watch_path, MsgType, Perm, Perms, WireError};

/// A request's meaning. Strings borrow from the payload they were parsed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    /// `CONTROL <command>|[<parameters>|]`: implementation-specific commands.
    Control { args: Vec<&'a [u8]> },
    /// `DIRECTORY <path>|`
    Directory { path: &'a str },
    /// `DIRECTORY_PART <path>|<offset>|`
    DirectoryPart { path: &'a str, offset: u32 },
    /// `READ <path>|`
    Read { path: &'a str },
    /// `GET_PERMS <path>|`
    GetPerms { path: &'a str },
    /// `WATCH <wpath>|<token>|?`
    Watch { path: &'a str, token: &'a str },
    /// `UNWATCH <wpath>|<token>|?`
    Unwatch { path: &'a str, token: &'a str },
    /// `TRANSACTION_START |`
    TransactionStart,
    /// `TRANSACTION_END T|` (commit) or `F|` (abort)
    TransactionEnd { commit: bool },
    /// `INTRODUCE <domid>|<mfn>|<evtchn>|?`
    Introduce { domid: u32, mfn: u64, evtchn: u32 },
    /// `RELEASE <domid>|`
    Release { domid: u32 },
    /// `GET_DOMAIN_PATH <domid>|`
    GetDomainPath { domid: u32 },
    /// `WRITE <path>|<value|>`
    Write { path: &'a str, value: &'a [u8] },
    /// `MKDIR <path>|`
    Mkdir { path: &'a str },
    /// `RM <path>|`
    Rm { path: &'a str },
    /// `SET_PERMS <path>|<perm-as-string>|+`
    SetPerms { path: &'a str, perms: Perms },
    /// `IS_DOMAIN_INTRODUCED <domid>|`
    IsDomainIntroduced { domid: u32 },
    /// `RESUME <domid>|`
    Resume { domid: u32 },
    /// `SET_TARGET <domid>|<tdomid>|`
    SetTarget { domid: u32, target: u32 },
    /// `RESET_WATCHES |`
    ResetWatches,
    /// `GET_FEATURE [<domid>|]`: the server's features, or a domain's.
    GetFeature { domid: Option<u32> },
    /// `SET_FEATURE <domid>|<value>|`
    SetFeature { domid: u32, features: u32 },
    /// `GET_QUOTA [[<domid>|]<quota>|]`: no quota name lists the quota names (and then
    /// `domid` is not sent).
    GetQuota {
        domid: Option<u32>,
        quota: Option<&'a str>,
    },
    /// `SET_QUOTA [<domid>|]<quota>|<value>|`: no domid sets the global default.
    SetQuota {
        domid: Option<u32>,
        quota: &'a str,
        value: u32,
    },
}

fn node_path(ty: MsgType, bytes: &[u8]) -> Result<&str, WireError> {
    let path = utf8(ty, bytes)?;
    check_path(path)?;
    Ok(path)
}

fn watch_path(ty: MsgType, bytes: &[u8]) -> Result<&str, WireError> {
    let path = utf8(ty, bytes)?;
    check_watch_path(path)?;
    Ok(path)
}

fn one_path(ty: MsgType, payload: &[u8]) -> Result<&str, WireError> {
    let [path] = exact::<1>(ty, payload, "1")?;
    node_path(ty, path)
}

fn one_domid(ty: MsgType, payload: &[u8]) -> Result<u32, WireError> {
    let [domid] = exact::<1>(ty, payload, "1")?;
    number(ty, domid)
}

/// A payload that carries nothing: empty, or one empty string.
fn no_args(ty: MsgType, payload: &[u8]) -> Result<(), WireError> {
    match payload {
        [] | [0] => Ok(()),
        _ => Err(WireError::ArgCount {
            ty,
            got: split_strings(ty, payload).map(|v| v.len()).unwrap_or(1),
            expected: "0",
        }),
    }
}

impl<'a> Request<'a> {
    /// Parses the payload of a request of type `ty`.
    pub fn parse(ty: MsgType, payload: &'a [u8]) -> Result<Request<'a>, WireError> {
        Ok(match ty {
            MsgType::Control => Request::Control {
                args: split_strings(ty, payload)?,
            },
            MsgType::Directory => Request::Directory {
                path: one_path(ty, payload)?,
            },
            MsgType::DirectoryPart => {
                let [path, offset] = exact::<2>(ty, payload, "2")?;
                Request::DirectoryPart {
                    path: node_path(ty, path)?,
                    offset: number(ty, offset)?,
                }
            }
            MsgType::Read => Request::Read {
                path: one_path(ty, payload)?,
            },
            MsgType::GetPerms => Request::GetPerms {
                path: one_path(ty, payload)?,
            },
            MsgType::Watch | MsgType::Unwatch => {
                let parts = split_strings(ty, payload)?;
                // The third, reserved string is tolerated (and ignored) as xenstored does.
                if !(2..=3).contains(&parts.len()) {
                    return Err(WireError::ArgCount {
                        ty,
                        got: parts.len(),
                        expected: "2",
                    });
                }
                let path = watch_path(ty, parts[0])?;
                let token = utf8(ty, parts[1])?;
                if ty == MsgType::Watch {
                    Request::Watch { path, token }
                } else {
                    Request::Unwatch { path, token }
                }
            }
            MsgType::TransactionStart => {
                no_args(ty, payload)?;
                Request::TransactionStart
            }
            MsgType::TransactionEnd => {
                let [flag] = exact::<1>(ty, payload, "1")?;
                let commit = match flag {
                    b"T" => true,
                    b"F" => false,
                    _ => {
                        return Err(WireError::BadNumber {
                            ty,
                            text: String::from_utf8_lossy(flag).into_owned(),
                        })
                    }
                };
                Request::TransactionEnd { commit }
            }
            MsgType::Introduce => {
                let parts = split_strings(ty, payload)?;
                if !(3..=4).contains(&parts.len()) {
                    return Err(WireError::ArgCount {
                        ty,
                        got: parts.len(),
                        expected: "3",
                    });
                }
                Request::Introduce {
                    domid: number(ty, parts[0])?,
                    mfn: number(ty, parts[1])?,
                    evtchn: number(ty, parts[2])?,
                }
            }
            MsgType::Release => Request::Release {
                domid: one_domid(ty, payload)?,
            },
            MsgType::GetDomainPath => Request::GetDomainPath {
                domid: one_domid(ty, payload)?,
            },
            MsgType::Write => {
                let (path, value) = split_first(ty, payload)?;
                Request::Write {
                    path: node_path(ty, path)?,
                    value,
                }
            }
            MsgType::Mkdir => Request::Mkdir {
                path: one_path(ty, payload)?,
            },
            MsgType::Rm => Request::Rm {
                path: one_path(ty, payload)?,
            },
            MsgType::SetPerms => {
                let parts = split_strings(ty, payload)?;
                if parts.len() < 2 {
                    return Err(WireError::ArgCount {
                        ty,
                        got: parts.len(),
                        expected: "at least 2",
                    });
                }
                // `@introduceDomain` / `@releaseDomain` carry permissions too (XSA-115).
                let path = watch_path(ty, parts[0])?;
                let perms = parts[1..]
                    .iter()
                    .map(|p| Perm::parse(utf8(ty, p)?))
                    .collect::<Result<Vec<_>, _>>()?;
                Request::SetPerms {
                    path,
                    perms: Perms(perms),
                }
            }
            MsgType::IsDomainIntroduced => Request::IsDomainIntroduced {
                domid: one_domid(ty, payload)?,
            },
            MsgType::Resume => Request::Resume {
                domid: one_domid(ty, payload)?,
            },
            MsgType::SetTarget => {
                let [domid, target] = exact::<2>(ty, payload, "2")?;
                Request::SetTarget {
                    domid: number(ty, domid)?,
                    target: number(ty, target)?,
                }
            }
            MsgType::ResetWatches => {
                no_args(ty, payload)?;
                Request::ResetWatches
            }
            MsgType::GetFeature => {
                let parts = split_strings(ty, payload)?;
                match parts.as_slice() {
                    [] => Request::GetFeature { domid: None },
                    [domid] => Request::GetFeature {
                        domid: Some(number(ty, domid)?),
                    },
                    _ => {
                        return Err(WireError::ArgCount {
                            ty,
                            got: parts.len(),
                            expected: "0 or 1",
                        })
                    }
                }
            }
            MsgType::SetFeature => {
                let [domid, features] = exact::<2>(ty, payload, "2")?;
                Request::SetFeature {
                    domid: number(ty, domid)?,
                    features: number(ty, features)?,
                }
            }
            MsgType::GetQuota => {
                let parts = split_strings(ty, payload)?;
                match parts.as_slice() {
                    [] => Request::GetQuota {
                        domid: None,
                        quota: None,
                    },
                    [quota] => Request::GetQuota {
                        domid: None,
                        quota: Some(utf8(ty, quota)?),
                    },
                    [domid, quota] => Request::GetQuota {
                        domid: Some(number(ty, domid)?),
                        quota: Some(utf8(ty, quota)?),
                    },
                    _ => {
                        return Err(WireError::ArgCount {
                            ty,
                            got: parts.len(),
                            expected: "0 to 2",
                        })
                    }
                }
            }
            MsgType::SetQuota => {
                let parts = split_strings(ty, payload)?;
                match parts.as_slice() {
                    [quota, value] => Request::SetQuota {
                        domid: None,
                        quota: utf8(ty, quota)?,
                        value: number(ty, value)?,
                    },
                    [domid, quota, value] => Request::SetQuota {
                        domid: Some(number(ty, domid)?),
                        quota: utf8(ty, quota)?,
                        value: number(ty, value)?,
                    },
                    _ => {
                        return Err(WireError::ArgCount {
                            ty,
                            got: parts.len(),
                            expected: "2 or 3",
                        })
                    }
                }
            }
            MsgType::WatchEvent | MsgType::Error => return Err(WireError::WrongDirection(ty)),
        })
    }

    /// The message type this request is sent as.
    pub fn msg_type(&self) -> MsgType {
        match self {
            Request::Control { .. } => MsgType::Control,
            Request::Directory { .. } => MsgType::Directory,
            Request::DirectoryPart { .. } => MsgType::DirectoryPart,
            Request::Read { .. } => MsgType::Read,
            Request::GetPerms { .. } => MsgType::GetPerms,
            Request::Watch { .. } => MsgType::Watch,
            Request::Unwatch { .. } => MsgType::Unwatch,
            Request::TransactionStart => MsgType::TransactionStart,
            Request::TransactionEnd { .. } => MsgType::TransactionEnd,
            Request::Introduce { .. } => MsgType::Introduce,
            Request::Release { .. } => MsgType::Release,
            Request::GetDomainPath { .. } => MsgType::GetDomainPath,
            Request::Write { .. } => MsgType::Write,
            Request::Mkdir { .. } => MsgType::Mkdir,
            Request::Rm { .. } => MsgType::Rm,
            Request::SetPerms { .. } => MsgType::SetPerms,
            Request::IsDomainIntroduced { .. } => MsgType::IsDomainIntroduced,
            Request::Resume { .. } => MsgType::Resume,
            Request::SetTarget { .. } => MsgType::SetTarget,
            Request::ResetWatches => MsgType::ResetWatches,
            Request::GetFeature { .. } => MsgType::GetFeature,
            Request::SetFeature { .. } => MsgType::SetFeature,
            Request::GetQuota { .. } => MsgType::GetQuota,
            Request::SetQuota { .. } => MsgType::SetQuota,
        }
    }

    /// Appends the payload bytes, as libxenstore sends them.
    pub fn emit(&self, out: &mut Vec<u8>) {
        let num = |out: &mut Vec<u8>, n: u64| put(out, n.to_string().as_bytes());
        match self {
            Request::Control { args } => args.iter().for_each(|a| put(out, a)),
            Request::Directory { path }
            | Request::Read { path }
            | Request::GetPerms { path }
            | Request::Mkdir { path }
            | Request::Rm { path } => put(out, path.as_bytes()),
            Request::DirectoryPart { path, offset } => {
                put(out, path.as_bytes());
                num(out, u64::from(*offset));
            }
            Request::Watch { path, token } | Request::Unwatch { path, token } => {
                put(out, path.as_bytes());
                put(out, token.as_bytes());
            }
            Request::TransactionStart | Request::ResetWatches => put(out, b""),
            Request::TransactionEnd { commit } => put(out, if *commit { b"T" } else { b"F" }),
            Request::Introduce { domid, mfn, evtchn } => {
                num(out, u64::from(*domid));
                num(out, *mfn);
                num(out, u64::from(*evtchn));
            }
            Request::Release { domid }
            | Request::GetDomainPath { domid }
            | Request::IsDomainIntroduced { domid }
            | Request::Resume { domid } => num(out, u64::from(*domid)),
            Request::Write { path, value } => {
                put(out, path.as_bytes());
                out.extend_from_slice(value);
            }
            Request::SetPerms { path, perms } => {
                put(out, path.as_bytes());
                for p in &perms.0 {
                    put(out, p.to_string().as_bytes());
                }
            }
            Request::SetTarget { domid, target } => {
                num(out, u64::from(*domid));
                num(out, u64::from(*target));
            }
            Request::GetFeature { domid } => {
                if let Some(d) = domid {
                    num(out, u64::from(*d));
                }
            }
            Request::SetFeature { domid, features } => {
                num(out, u64::from(*domid));
                num(out, u64::from(*features));
            }
            Request::GetQuota { domid, quota } => {
                // A domid is only meaningful together with a quota name.
                if let Some(q) = quota {
                    if let Some(d) = domid {
                        num(out, u64::from(*d));
                    }
                    put(out, q.as_bytes());
                }
            }
            Request::SetQuota {
                domid,
                quota,
                value,
            } => {
                if let Some(d) = domid {
                    num(out, u64::from(*d));
                }
                put(out, quota.as_bytes());
                num(out, u64::from(*value));
            }
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
