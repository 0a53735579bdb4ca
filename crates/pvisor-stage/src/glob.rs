//! Path selection patterns: `*` and `?` within one path component, `**`
//! across components, `[abc]` / `[a-z]` / `[!x]` classes. Matched on bytes,
//! so names that are not UTF-8 can be selected too.

/// Returns whether `pattern` contains glob syntax.
pub fn is_glob(pattern: &str) -> bool {
    pattern.contains(['*', '?', '['])
}

/// Returns whether `path` matches `pattern` in full.
pub fn matches(pattern: &[u8], path: &[u8]) -> bool {
    match pattern.split_first() {
        None => path.is_empty(),
        Some((b'*', rest)) if rest.first() == Some(&b'*') => {
            // `**` spans components; `**/` may also match nothing.
            let rest = &rest[1..];
            let rest_no_slash = rest.strip_prefix(b"/").unwrap_or(rest);
            (0..=path.len()).any(|i| matches(rest, &path[i..]))
                || (rest.len() != rest_no_slash.len() && matches(rest_no_slash, path))
        }
        Some((b'*', rest)) => {
            let mut i = 0;
            loop {
                if matches(rest, &path[i..]) {
                    return true;
                }
                if i == path.len() || path[i] == b'/' {
                    return false;
                }
                i += 1;
            }
        }
        Some((b'?', rest)) => matches!(path.first(), Some(c) if *c != b'/') && matches(rest, &path[1..]),
        Some((b'[', rest)) => {
            let Some(end) = rest.iter().skip(1).position(|&c| c == b']').map(|p| p + 1) else {
                return path.first() == Some(&b'[') && matches(rest, &path[1..]);
            };
            let (class, after) = (&rest[..end], &rest[end + 1..]);
            let (negate, class) = match class.first() {
                Some(b'!') | Some(b'^') => (true, &class[1..]),
                _ => (false, class),
            };
            let Some(&c) = path.first() else { return false };
            if c == b'/' {
                return false;
            }
            let mut hit = false;
            let mut i = 0;
            while i < class.len() {
                if i + 2 < class.len() && class[i + 1] == b'-' {
                    hit |= class[i] <= c && c <= class[i + 2];
                    i += 3;
                } else {
                    hit |= class[i] == c;
                    i += 1;
                }
            }
            hit != negate && matches(after, &path[1..])
        }
        Some((c, rest)) => path.first() == Some(c) && matches(rest, &path[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, s: &str) -> bool {
        matches(p.as_bytes(), s.as_bytes())
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
        assert!(is_glob("a*") && !is_glob("plain/path"));
    }
}
