//! Splitting payloads into nul-terminated strings, and joining them back.

use super::{MsgType, WireError};

/// Splits a payload made only of nul-terminated strings. The final byte must be a nul.
pub(crate) fn split_strings(ty: MsgType, payload: &[u8]) -> Result<Vec<&[u8]>, WireError> {
    if payload.is_empty() {
        return Ok(Vec::new());
    }
    if payload.last() != Some(&0) {
        return Err(WireError::Unterminated(ty));
    }
    Ok(payload[..payload.len() - 1].split(|&b| b == 0).collect())
}

/// Splits off the first nul-terminated string; returns it and the rest.
pub(crate) fn split_first(ty: MsgType, payload: &[u8]) -> Result<(&[u8], &[u8]), WireError> {
    let nul = payload
        .iter()
        .position(|&b| b == 0)
        .ok_or(WireError::Unterminated(ty))?;
    Ok((&payload[..nul], &payload[nul + 1..]))
}

/// Exactly `N` nul-terminated strings.
pub(crate) fn exact<'a, const N: usize>(
    ty: MsgType,
    payload: &'a [u8],
    expected: &'static str,
) -> Result<[&'a [u8]; N], WireError> {
    let parts = split_strings(ty, payload)?;
    let got = parts.len();
    parts
        .try_into()
        .map_err(|_| WireError::ArgCount { ty, got, expected })
}

pub(crate) fn utf8(ty: MsgType, bytes: &[u8]) -> Result<&str, WireError> {
    std::str::from_utf8(bytes).map_err(|_| WireError::NotUtf8(ty))
}

/// A decimal number as xenstored's C parsers accept it (digits only; no sign, no spaces).
pub(crate) fn number<N: std::str::FromStr>(ty: MsgType, bytes: &[u8]) -> Result<N, WireError> {
    let bad = || WireError::BadNumber {
        ty,
        text: String::from_utf8_lossy(bytes).into_owned(),
    };
    if bytes.is_empty() || !bytes.iter().all(u8::is_ascii_digit) {
        return Err(bad());
    }
    utf8(ty, bytes)?.parse().map_err(|_| bad())
}

/// Appends `s` and a nul.
pub(crate) fn put(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(s);
    out.push(0);
}
