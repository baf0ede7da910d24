//! Path syntax (docs/misc/xenstore.txt): `/`-separated, ASCII alphanumerics and `-/_@`,
//! no doubled or trailing slash (except the root), not empty, bounded length.

use super::{ABS_PATH_MAX, REL_PATH_MAX};

/// What kind of path a syntactically valid path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathKind {
    /// Starts with `/`.
    Absolute,
    /// Relative to the caller's `/local/domain/<domid>`.
    Relative,
    /// `@<name>`: a special watch (`@introduceDomain`, `@releaseDomain`), watches only.
    Special,
}

/// Why a path is not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("empty path")]
    Empty,
    #[error("path of {len} bytes exceeds the {max}-byte limit")]
    TooLong { len: usize, max: usize },
    #[error("invalid character {0:?} in path")]
    BadChar(char),
    #[error("doubled slash in path")]
    DoubleSlash,
    #[error("trailing slash in path")]
    TrailingSlash,
    #[error("special path {0:?} is only valid for watches")]
    SpecialNotAllowed(String),
}

fn valid_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'-' | b'/' | b'_' | b'@')
}

/// Checks a node path (absolute or relative); special `@` paths are refused.
pub fn check_path(path: &str) -> Result<PathKind, PathError> {
    match check_watch_path(path)? {
        PathKind::Special => Err(PathError::SpecialNotAllowed(path.to_owned())),
        kind => Ok(kind),
    }
}

/// Checks a watch path: a node path or a special `@<name>`.
pub fn check_watch_path(path: &str) -> Result<PathKind, PathError> {
    let bytes = path.as_bytes();
    if bytes.is_empty() {
        return Err(PathError::Empty);
    }
    let kind = match bytes[0] {
        b'/' => PathKind::Absolute,
        b'@' => PathKind::Special,
        _ => PathKind::Relative,
    };
    let max = if kind == PathKind::Relative {
        REL_PATH_MAX
    } else {
        ABS_PATH_MAX
    };
    if bytes.len() > max {
        return Err(PathError::TooLong {
            len: bytes.len(),
            max,
        });
    }
    if let Some(&c) = bytes.iter().find(|&&c| !valid_char(c)) {
        return Err(PathError::BadChar(c as char));
    }
    if kind == PathKind::Special {
        // Special names have their own syntax; only their characters are checked.
        return Ok(kind);
    }
    if path.contains("//") {
        return Err(PathError::DoubleSlash);
    }
    if bytes.len() > 1 && bytes[bytes.len() - 1] == b'/' {
        return Err(PathError::TrailingSlash);
    }
    Ok(kind)
}
