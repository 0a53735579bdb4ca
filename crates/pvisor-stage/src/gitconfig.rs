//! The two things of a git config file that decide what the host runs from
//! a workspace: `core.hooksPath` (the directory git runs hooks from) and
//! `include.path` / `includeIf.*.path` (more config files git obeys).
//!
//! The file is untrusted (the repository's own, or staged by the command),
//! so this reader never fails: what it cannot parse it skips, and it reads
//! generously rather than strictly (a value git would take is never missed
//! for want of an exotic spelling: quotes, escapes, continuations, inline
//! comments and the old `[section.sub]` header are all understood).

/// What a config file names.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Named {
    /// Every `core.hooksPath` value (git uses the last; each is a risk).
    pub hooks_paths: Vec<String>,
    /// Every `include.path` and `includeIf.<cond>.path` value.
    pub includes: Vec<String>,
}

/// Reads `text` (a git config file's bytes; invalid UTF-8 is replaced).
pub fn named(text: &[u8]) -> Named {
    let text = String::from_utf8_lossy(text);
    let mut out = Named::default();
    let mut section = String::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let mut line = line.trim_start().to_owned();
        // A value continued with a trailing backslash.
        while line.ends_with('\\') && !line.ends_with("\\\\") {
            line.pop();
            match lines.next() {
                Some(next) => line.push_str(next),
                None => break,
            }
        }
        if let Some(rest) = line.strip_prefix('[') {
            section = section_name(rest);
            // `[core] hooksPath = x` on one line is valid git config.
            match rest.find(']') {
                Some(end) => line = rest[end + 1..].trim_start().to_owned(),
                None => continue,
            }
        }
        let Some((key, value)) = key_value(&line) else { continue };
        let key = key.to_ascii_lowercase();
        if section == "core" && key == "hookspath" {
            out.hooks_paths.push(value);
        } else if key == "path" && (section == "include" || section.starts_with("includeif")) {
            out.includes.push(value);
        }
    }
    out
}

/// `core` from `core]`, `includeif` from `includeIf "gitdir:x"]`, and
/// `core` from the old `core.sub]`: the section's own name, lower case.
fn section_name(header: &str) -> String {
    let end = header.find([']', ' ', '\t', '"', '.']).unwrap_or(header.len());
    header[..end].to_ascii_lowercase()
}

/// `key = value` (or a bare `key`, a boolean) with the value unquoted,
/// unescaped and its inline comment removed.
fn key_value(line: &str) -> Option<(&str, String)> {
    let line = line.trim();
    if line.is_empty() || line.starts_with(['#', ';']) {
        return None;
    }
    let (key, raw) = match line.find('=') {
        Some(i) => (line[..i].trim(), &line[i + 1..]),
        None => (line, ""),
    };
    if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return None;
    }
    Some((key, value(raw)))
}

fn value(raw: &str) -> String {
    let mut out = String::new();
    let mut quoted = false;
    let mut chars = raw.trim().chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => quoted = !quoted,
            '\\' => match chars.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some('b') => {
                    out.pop();
                }
                Some(other) => out.push(other),
                None => {}
            },
            '#' | ';' if !quoted => break,
            other => out.push(other),
        }
    }
    if !raw.contains('"') {
        return out.trim_end().to_owned();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hooks_paths_and_includes_are_found_however_spelled() {
        let text = b"[core]\n\tbare = false\n\thooksPath = tools/hooks ; a comment\n\
            [CORE]\nHOOKSPATH = \"with space\\\"q\"\n\
            [core] hookspath = one-line\n\
            [core.sub]\nhooksPath = old-style\n\
            [include]\n\tpath = ../shared.cfg\n\
            [includeIf \"gitdir:~/w/\"]\n\tpath = more.cfg\n\
            [user]\n\thooksPath = not-core\n\
            [core]\nhooksPath = contin\\\nued\n";
        let named = named(text);
        assert_eq!(named.hooks_paths, ["tools/hooks", "with space\"q", "one-line", "old-style", "continued"]);
        assert_eq!(named.includes, ["../shared.cfg", "more.cfg"]);
        let bad_utf8 = super::named(b"[core]\n# \xff\xfe\nhooksPath = h\n");
        assert_eq!(bad_utf8.hooks_paths, ["h"], "bad UTF-8 is skipped, not fatal");
        assert_eq!(super::named(b"[core\n\"\\\n=\n[]]]"), Named::default());
    }
}
