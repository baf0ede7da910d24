//! Making text that a guest (or any other domain) wrote safe to show on an admin's terminal or
//! in a log line.
//!
//! A guest owns its XenStore directories and writes whatever bytes it likes there: escape
//! sequences that retitle the window, clear the screen, move the cursor or rewrite earlier
//! lines; bidirectional-override characters that reorder what is shown; newlines that forge log
//! lines; bytes that are not UTF-8. [`escape_bytes`] and [`escape_str`] turn every such byte or
//! character into a visible escape, keep printable text (including non-ASCII letters) as it
//! is, and are unambiguous: a backslash is doubled, so escaped output never looks like an
//! escape that was not there.
//!
//! | input                                          | shown as        |
//! |------------------------------------------------|-----------------|
//! | `\`                                            | `\\`            |
//! | tab, newline, carriage return                  | `\t` `\n` `\r`  |
//! | other C0 controls, DEL (`0x00`–`0x1f`, `0x7f`) | `\x1b`, `\x7f`  |
//! | C1 controls `U+0080`–`U+009F` (8-bit CSI ...)  | `\u{9b}`        |
//! | invisible and direction-changing characters    | `\u{202e}`      |
//! | a byte that is not part of valid UTF-8         | `\xff`          |
//!
//! "Invisible and direction-changing" are the Unicode format characters that terminals do
//! not draw but that change what is drawn: zero-width spaces and joiners, the bidi marks,
//! embeddings, overrides and isolates, the line and paragraph separators, the word joiner and
//! invisible operators, the byte-order mark, and the interlinear annotation marks.

use std::fmt::{self, Write};

/// `bytes` as text safe for a terminal or a log line (see the module documentation).
pub fn escape_bytes(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            push_char(&mut out, c);
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}

/// `s` as text safe for a terminal or a log line (see the module documentation).
pub fn escape_str(s: &str) -> String {
    escape_bytes(s.as_bytes())
}

/// Formats as [`escape_str`] without allocating: `tracing::info!("{}", Escaped(name))`.
#[derive(Debug, Clone, Copy)]
pub struct Escaped<'a>(pub &'a str);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.0.chars() {
            if needs_escape(c) {
                f.write_str(&escape_char(c))?;
            } else {
                f.write_char(c)?;
            }
        }
        Ok(())
    }
}

fn push_char(out: &mut String, c: char) {
    if needs_escape(c) {
        out.push_str(&escape_char(c));
    } else {
        out.push(c);
    }
}

fn escape_char(c: char) -> String {
    match c {
        '\\' => "\\\\".to_owned(),
        '\t' => "\\t".to_owned(),
        '\n' => "\\n".to_owned(),
        '\r' => "\\r".to_owned(),
        c if (c as u32) < 0x80 => format!("\\x{:02x}", c as u32),
        c => format!("\\u{{{:x}}}", c as u32),
    }
}

fn needs_escape(c: char) -> bool {
    c == '\\' || c.is_control() || is_invisible_format(c)
}

/// Unicode format characters (general category Cf) and separators that a terminal does not
/// draw but that change what it draws.
fn is_invisible_format(c: char) -> bool {
    matches!(
        c as u32,
        0x00ad                // soft hyphen
        | 0x061c              // Arabic letter mark
        | 0x180e              // Mongolian vowel separator
        | 0x200b..=0x200f     // zero-width space, (non-)joiner, LRM, RLM
        | 0x2028..=0x202e     // line/paragraph separators, embeddings and overrides
        | 0x2060..=0x206f     // word joiner, invisible operators, isolates, deprecated controls
        | 0xfeff              // byte-order mark / zero-width no-break space
        | 0xfff9..=0xfffb     // interlinear annotation
        | 0xe0000..=0xe007f // tags
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printable_text_is_unchanged() {
        for s in ["", "bypass", "soft-iwarp", "a b/c_d@e=1", "café Ω 日本"] {
            assert_eq!(escape_str(s), s);
            assert_eq!(Escaped(s).to_string(), s);
        }
    }

    #[test]
    fn terminal_controls_become_visible() {
        assert_eq!(
            escape_str("\x1b]0;owned\x07\x1b[2J"),
            "\\x1b]0;owned\\x07\\x1b[2J"
        );
        assert_eq!(escape_str("a\nb\rc\td\0\x7f"), "a\\nb\\rc\\td\\x00\\x7f");
        // 8-bit CSI and the other C1 controls.
        assert_eq!(escape_str("\u{9b}31m\u{85}"), "\\u{9b}31m\\u{85}");
        // Bidi override ("Trojan source") and zero-width characters.
        assert_eq!(
            escape_str("ok\u{202e}gnp.exe\u{200b}\u{2066}\u{feff}"),
            "ok\\u{202e}gnp.exe\\u{200b}\\u{2066}\\u{feff}"
        );
    }

    #[test]
    fn invalid_utf8_bytes_are_shown_as_hex() {
        assert_eq!(escape_bytes(b"ab\xffc\xc3"), "ab\\xffc\\xc3");
        assert_eq!(escape_bytes("é".as_bytes()), "é");
        // An overlong encoding of ESC is not decoded into one.
        assert_eq!(escape_bytes(b"\xc0\x9b"), "\\xc0\\x9b");
    }

    #[test]
    fn escaping_is_unambiguous() {
        // A literal backslash sequence does not look like an escaped control.
        assert_eq!(escape_str("\\x1b"), "\\\\x1b");
        assert_ne!(escape_str("\\x1b"), escape_str("\x1b"));
    }

    #[test]
    fn output_never_holds_a_control_or_format_character() {
        let all: Vec<u8> = (0..=255u8).collect();
        let mut s: String = (0..0x3000u32).filter_map(char::from_u32).collect();
        s.push_str(&escape_bytes(&all));
        for out in [escape_bytes(&all), escape_str(&s), Escaped(&s).to_string()] {
            assert!(
                out.chars()
                    .all(|c| !c.is_control() && !is_invisible_format(c)),
                "{out:?}"
            );
        }
        assert_eq!(Escaped(&s).to_string(), escape_str(&s));
    }
}
