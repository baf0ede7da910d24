//! Permissions: `<perm-as-string>` is one of `w<domid>`, `r<domid>`, `b<domid>`, `n<domid>`.
//! The first entry names the owner and the access of every domain not listed after it.

use std::fmt;

use super::WireError;

/// Access granted by one permission entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PermKind {
    /// `n`: no access.
    None,
    /// `r`: read only.
    Read,
    /// `w`: write only.
    Write,
    /// `b`: read and write.
    Both,
}

impl PermKind {
    pub fn letter(self) -> char {
        match self {
            PermKind::None => 'n',
            PermKind::Read => 'r',
            PermKind::Write => 'w',
            PermKind::Both => 'b',
        }
    }

    pub fn can_read(self) -> bool {
        matches!(self, PermKind::Read | PermKind::Both)
    }

    pub fn can_write(self) -> bool {
        matches!(self, PermKind::Write | PermKind::Both)
    }
}

/// One permission entry: access for a domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Perm {
    pub kind: PermKind,
    pub domid: u32,
}

impl Perm {
    pub fn new(kind: PermKind, domid: u32) -> Perm {
        Perm { kind, domid }
    }

    /// Parses `[nrwb]<domid>`; the domid is decimal 0..=65535.
    pub fn parse(text: &str) -> Result<Perm, WireError> {
        let bad = || WireError::BadPerm(text.to_owned());
        let mut chars = text.chars();
        let kind = match chars.next() {
            Some('n') => PermKind::None,
            Some('r') => PermKind::Read,
            Some('w') => PermKind::Write,
            Some('b') => PermKind::Both,
            _ => return Err(bad()),
        };
        let digits = chars.as_str();
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let domid: u32 = digits.parse().map_err(|_| bad())?;
        if domid > 0xffff {
            return Err(bad());
        }
        Ok(Perm { kind, domid })
    }
}

impl fmt::Display for Perm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.kind.letter(), self.domid)
    }
}

/// A node's permission list: owner first (its kind is the default for unlisted domains),
/// then per-domain entries.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Perms(pub Vec<Perm>);

impl Perms {
    /// A list with just the owner entry.
    pub fn owned_by(owner: u32, others: PermKind) -> Perms {
        Perms(vec![Perm::new(others, owner)])
    }

    /// The owning domain.
    pub fn owner(&self) -> Option<u32> {
        self.0.first().map(|p| p.domid)
    }
}
