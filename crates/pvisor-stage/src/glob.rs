//! Path selection patterns: `*` and `?` within one path component, `**`
//! across components, `[abc]` / `[a-z]` / `[!x]` classes, `\\` to escape.
//! Matched on bytes, so names that are not UTF-8 can be selected too.
//!
//! Compiled by `globset` into an automaton, so matching is linear in the
//! name whatever the pattern: a hand-written backtracking matcher took
//! seconds on a pattern of many stars, and `pvisor serve`'s file search hands
//! this any pattern a sandbox client sends.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// A pattern that is not a valid glob (an unclosed `[`, say).
#[derive(Debug, Clone, thiserror::Error)]
#[error("invalid glob {pattern:?}: {reason}; put a backslash before a literal *, ?, [ or \\")]
pub struct BadPattern {
    pub pattern: String,
    pub reason: String,
}

/// A compiled selection pattern.
#[derive(Debug, Clone)]
pub struct Pattern {
    text: String,
    matcher: globset::GlobMatcher,
}

impl Pattern {
    pub fn new(pattern: &str) -> Result<Self, BadPattern> {
        let glob = globset::GlobBuilder::new(pattern)
            .literal_separator(true)
            .backslash_escape(true)
            .build()
            .map_err(|e| BadPattern { pattern: pattern.to_owned(), reason: e.kind().to_string() })?;
        Ok(Self { text: pattern.to_owned(), matcher: glob.compile_matcher() })
    }

    /// Whether `path` matches the whole pattern.
    pub fn matches(&self, path: &[u8]) -> bool {
        self.matcher.is_match(Path::new(OsStr::from_bytes(path)))
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }
}

/// Returns whether `pattern` contains glob syntax.
pub fn is_glob(pattern: &str) -> bool {
    pattern.contains(['*', '?', '['])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, s: &str) -> bool {
        Pattern::new(p).unwrap().matches(s.as_bytes())
    }

    #[test]
    fn stars_stay_within_a_component_and_double_stars_cross() {
        assert!(m("*.rs", "main.rs"));
        assert!(!m("*.rs", "src/main.rs"));
        assert!(m("src/*.rs", "src/main.rs"));
        assert!(m("**/*.rs", "src/a/b.rs"));
        assert!(m("**/*.rs", "top.rs"));
        assert!(m("src/**", "src/a/b"));
        assert!(!m("src/**", "srcx/a"));
    }

    #[test]
    fn classes_and_question_marks() {
        assert!(m("file[0-9].txt", "file7.txt"));
        assert!(!m("file[!0-9].txt", "file7.txt"));
        assert!(m("?.c", "a.c"));
        assert!(!m("?.c", "/.c"));
        assert!(m("a\\*b", "a*b") && !m("a\\*b", "axb"));
        assert!(is_glob("a*") && !is_glob("plain/path"));
    }

    #[test]
    fn names_that_are_not_utf8_match_on_bytes() {
        let p = Pattern::new("*.bin").unwrap();
        assert!(p.matches(b"\xff\xfe.bin"));
        assert!(!p.matches(b"\xff/x.bin"));
    }

    #[test]
    fn an_unclosed_class_is_a_clear_error() {
        let e = Pattern::new("file[0-9").unwrap_err();
        assert!(e.to_string().contains("file[0-9") && e.to_string().contains("backslash"), "{e}");
    }
}
