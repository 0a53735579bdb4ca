//! Names a person could mistake for others.
//!
//! A staged `setup.py ` (trailing space) or `setup\u{a0}py` (no-break space)
//! prints like the file it sits beside; review escapes invisible characters,
//! but a space is shown as a space. A name is marked confusable when it
//! begins or ends with whitespace, holds a space other than U+0020, holds an
//! invisible or bidi character, or equals a sibling's name once those are
//! removed, case is folded and common Cyrillic and Greek look-alikes are
//! read as Latin. Siblings are the host directory's entries
//! and the other staged names in the same directory.

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use pvisor_core::text;

/// Whether `c` is a space a person reads as one but is not U+0020.
fn is_other_space(c: char) -> bool {
    c != ' ' && (c.is_whitespace() || matches!(c, '\u{2800}' | '\u{3164}' | '\u{ffa0}' | '\u{115f}'))
}

/// The Latin letter a Cyrillic or Greek lower-case letter is drawn like, if
/// one is (the common look-alikes, not Unicode's whole confusables table).
fn latin_look_alike(c: char) -> char {
    match c {
        'а' | 'α' => 'a',
        'с' | 'ϲ' => 'c',
        'ԁ' => 'd',
        'е' | 'ε' => 'e',
        'һ' => 'h',
        'і' | 'ι' => 'i',
        'ј' => 'j',
        'κ' => 'k',
        'ӏ' => 'l',
        'о' | 'ο' => 'o',
        'р' | 'ρ' => 'p',
        'ѕ' => 's',
        'ν' => 'v',
        'х' | 'χ' => 'x',
        'у' | 'γ' => 'y',
        other => other,
    }
}

/// What a name looks like: invisible characters dropped, every space a
/// plain one, trimmed, case folded, common Cyrillic and Greek look-alikes
/// read as the Latin letters they resemble.
pub fn skeleton(name: &str) -> String {
    let mapped: String = name
        .chars()
        .filter(|&c| !text::is_unsafe(c) || c.is_whitespace())
        .map(|c| if is_other_space(c) { ' ' } else { c })
        .collect();
    mapped.trim().to_lowercase().chars().map(latin_look_alike).collect()
}

/// The names in one directory (the host's and the staged ones), by what
/// they look like.
#[derive(Debug, Default)]
pub struct Siblings {
    by_look: HashMap<String, BTreeSet<String>>,
}

impl Siblings {
    pub fn new<'a>(names: impl IntoIterator<Item = &'a OsStr>) -> Self {
        let mut by_look: HashMap<String, BTreeSet<String>> = HashMap::new();
        for name in names {
            let name = String::from_utf8_lossy(name.as_bytes()).into_owned();
            by_look.entry(skeleton(&name)).or_default().insert(name);
        }
        Self { by_look }
    }

    /// Why `name` (one of these or to be added to them) could be mistaken
    /// for another name, if it could.
    pub fn confusable(&self, name: &OsStr) -> Option<String> {
        let name = String::from_utf8_lossy(name.as_bytes());
        let codepoint = |c: char| format!("U+{:04X}", c as u32);
        if name.starts_with(char::is_whitespace) || name.ends_with(char::is_whitespace) {
            return Some("begins or ends with a space".into());
        }
        if let Some(c) = name.chars().find(|&c| text::is_unsafe(c)) {
            return Some(format!("holds {}, an invisible, control or bidi character", codepoint(c)));
        }
        if let Some(c) = name.chars().find(|&c| is_other_space(c)) {
            return Some(format!("holds {}, a space that is not U+0020", codepoint(c)));
        }
        let alike = self.by_look.get(&skeleton(&name))?;
        alike.iter().find(|other| **other != *name).map(|other| {
            format!(
                "looks like {} beside it (differs only in case, spaces, invisible characters or look-alike letters)",
                text::escape(other, text::Tabs::Escape)
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(name: &str, siblings: &[&str]) -> Option<String> {
        Siblings::new(siblings.iter().map(OsStr::new)).confusable(OsStr::new(name))
    }

    #[test]
    fn spaces_invisibles_and_look_alike_siblings_are_marked() {
        assert!(check("setup.py ", &["setup.py"]).unwrap().contains("space"));
        assert!(check("setup\u{a0}py", &[]).unwrap().contains("U+00A0"));
        assert!(check("guard\u{200b}.rs", &[]).unwrap().contains("U+200B"));
        assert!(check("Makefile", &["makefile"]).unwrap().contains("makefile"));
        // Cyrillic а and о beside the Latin name.
        assert!(check("p\u{430}yr\u{43e}ll.py", &["payroll.py"]).unwrap().contains("payroll.py"));
        assert_eq!(check("main.rs", &["lib.rs", "main.rs"]), None);
        assert_eq!(check("notes.txt", &[]), None);
    }
}
