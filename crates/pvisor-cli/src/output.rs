//! Output helpers: JSON Lines records and human formatting.
//!
//! `--json` output is one object per line, `{"type": KIND, "data": RECORD}`:
//! `type` names the record (`status`, `event`, …) and `data` is the record
//! itself; see `docs/cli-reference.md`.

use std::io::Write;

use anyhow::Context;
use serde::Serialize;

/// Where a command writes what it prints on stdout: the process's stdout,
/// or, in this crate's tests, the calling thread's capture (see
/// [`capture`]), so a test reads a command's output as a user would.
pub fn stdout() -> Stdout {
    #[cfg(test)]
    if CAPTURE.with(|c| c.borrow().is_some()) {
        return Stdout::Captured;
    }
    Stdout::Real(std::io::stdout().lock())
}

/// See [`stdout`].
pub enum Stdout {
    Real(std::io::StdoutLock<'static>),
    #[cfg(test)]
    Captured,
}

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Self::Real(out) => out.write(buf),
            #[cfg(test)]
            Self::Captured => {
                CAPTURE.with(|c| c.borrow_mut().get_or_insert_with(Vec::new).extend_from_slice(buf));
                Ok(buf.len())
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Self::Real(out) => out.flush(),
            #[cfg(test)]
            Self::Captured => Ok(()),
        }
    }
}

#[cfg(test)]
thread_local! {
    static CAPTURE: std::cell::RefCell<Option<Vec<u8>>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` with this thread's [`stdout`] captured; returns its result and
/// what it wrote there.
#[cfg(test)]
pub fn capture<T>(f: impl FnOnce() -> T) -> (T, String) {
    CAPTURE.with(|c| *c.borrow_mut() = Some(Vec::new()));
    let result = f();
    let bytes = CAPTURE.with(|c| c.borrow_mut().take()).unwrap_or_default();
    (result, String::from_utf8_lossy(&bytes).into_owned())
}

/// One `--json` line: what kind of record it is, and the record untouched
/// (ripgrep's envelope), so a record's own `type` field survives.
#[derive(Serialize)]
struct Envelope<'a, T> {
    r#type: &'a str,
    data: &'a T,
}

/// Writes `value` as one JSON line, `{"type": kind, "data": value}`.
pub fn json_line<T: Serialize>(out: &mut impl Write, kind: &str, value: &T) -> anyhow::Result<()> {
    let line =
        serde_json::to_vec(&Envelope { r#type: kind, data: value }).context("cannot encode JSON output")?;
    out.write_all(&line).context("cannot write output")?;
    out.write_all(b"\n").context("cannot write output")?;
    Ok(())
}

/// Quotes a command line for display, shell-style.
pub fn shell_words(program: &str, args: &[String]) -> String {
    let quoted = std::iter::once(program)
        .chain(args.iter().map(String::as_str))
        .map(quote_word)
        .collect::<Vec<_>>()
        .join(" ");
    // Quoting keeps the words apart; escaping keeps the terminal safe.
    pvisor_core::text::escape(&quoted, pvisor_core::text::Tabs::Escape).into_owned()
}

/// `word` as one POSIX shell word: bare when every byte is plainly safe,
/// else single-quoted (inside which a shell expands nothing).
pub fn quote_word(word: &str) -> String {
    if !word.is_empty() && word.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b)) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// `word` quoted for pasting into a shell, or `None` when the terminal
/// would not show it as it is (a control or invisible character): what is
/// printed for pasting must be exactly what runs.
pub fn pasteable(word: &str) -> Option<String> {
    (pvisor_core::text::count_unsafe(word) == 0 && !word.contains(['\t', '\n'])).then(|| quote_word(word))
}

/// Untrusted text (a reason quoting host names, an error, a path) made safe
/// for a terminal; see `pvisor_core::text`.
pub fn shown(text: &str) -> String {
    pvisor_core::text::escape(text, pvisor_core::text::Tabs::Escape).into_owned()
}

/// A path made safe for a terminal.
pub fn shown_path(path: &std::path::Path) -> String {
    shown(&path.to_string_lossy())
}

/// Describes how a run ended: `completed`, `failed (exit 3)`, `cancelled (signal 2)`.
pub fn ending(state: &str, exit_code: Option<i32>, signal: Option<i32>) -> String {
    match (exit_code, signal) {
        (Some(code), _) => format!("{state} (exit {code})"),
        (None, Some(sig)) => format!(
            "{state} (signal {sig}{})",
            signal_name(sig).map(|n| format!(", {n}")).unwrap_or_default()
        ),
        (None, None) => state.to_owned(),
    }
}

fn signal_name(sig: i32) -> Option<&'static str> {
    Some(match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGTERM => "SIGTERM",
        libc::SIGABRT => "SIGABRT",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_words_quote_only_when_needed() {
        assert_eq!(shell_words("sh", &["-c".into(), "echo 'x' > y".into()]), "sh -c 'echo '\\''x'\\'' > y'");
        assert_eq!(shell_words("true", &[]), "true");
    }

    #[test]
    fn json_lines_wrap_the_record_in_an_envelope() {
        let mut out = Vec::new();
        json_line(&mut out, "event", &serde_json::json!({"type": "run.started", "seq": 1})).unwrap();
        let line: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(line, serde_json::json!({"type": "event", "data": {"type": "run.started", "seq": 1}}));
        assert!(out.ends_with(b"}\n"));
        assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), 1);
    }

    #[test]
    fn a_test_reads_what_a_command_wrote_to_stdout() {
        let ((), text) = capture(|| json_line(&mut stdout(), "job", &serde_json::json!({"n": 1})).unwrap());
        assert_eq!(text, "{\"type\":\"job\",\"data\":{\"n\":1}}\n");
    }
}

/// How many per-path lines `apply` and `drop` print before summarising.
pub const PATH_LINES: usize = 20;

/// How much of a per-path listing to print: `-q` none, `-v` every path,
/// otherwise every path up to [`PATH_LINES`] and a summary by top-level
/// directory beyond that (a pip install stages thousands of files).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detail {
    Quiet,
    Summary,
    Verbose,
}

impl Detail {
    pub fn of(quiet: bool, verbose: bool) -> Self {
        match (quiet, verbose) {
            (true, _) => Self::Quiet,
            (false, true) => Self::Verbose,
            (false, false) => Self::Summary,
        }
    }
}

/// One line of a per-path listing: the verb (`applied`, `dropped`), the
/// change's kind, its (escaped) path and a note.
pub struct PathLine {
    pub word: String,
    pub kind: &'static str,
    pub path: String,
    pub note: String,
}

/// Prints `lines` at `detail`; a summary groups them by verb and top-level
/// directory, with counts by kind.
pub fn path_lines(out: &mut impl Write, lines: &[PathLine], detail: Detail) -> std::io::Result<()> {
    let every = |out: &mut dyn Write| -> std::io::Result<()> {
        for l in lines {
            writeln!(out, "  {:<11} {:<12} {}{}", l.word, l.kind, l.path, l.note)?;
        }
        Ok(())
    };
    match detail {
        Detail::Quiet => Ok(()),
        Detail::Verbose => every(out),
        Detail::Summary if lines.len() <= PATH_LINES => every(out),
        Detail::Summary => {
            use std::collections::BTreeMap;
            let mut groups: BTreeMap<(&str, String), BTreeMap<&str, usize>> = BTreeMap::new();
            for l in lines {
                // `lib` itself and what is under `lib/` are one group.
                let top = l.path.split_once('/').map_or(l.path.as_str(), |(dir, _)| dir).to_owned();
                *groups.entry((l.word.as_str(), top)).or_default().entry(l.kind).or_default() += 1;
            }
            for ((word, top), kinds) in groups.iter().take(PATH_LINES) {
                let total: usize = kinds.values().sum();
                let by_kind: Vec<String> = kinds.iter().map(|(k, n)| format!("{n} {k}")).collect();
                if total == 1 {
                    writeln!(out, "  {word:<11} {top} ({})", by_kind.join(", "))?;
                } else {
                    writeln!(out, "  {word:<11} {total} changes in {top}/ ({})", by_kind.join(", "))?;
                }
            }
            if groups.len() > PATH_LINES {
                writeln!(out, "  … and {} more groups", groups.len() - PATH_LINES)?;
            }
            writeln!(out, "  ({} paths in {} groups; -v lists every path)", lines.len(), groups.len())
        }
    }
}

/// How the user invoked pvisor, for the commands hints suggest:
/// `scripts/pvisor` sets `PVISOR_INVOKED_AS` to itself, so a hint says
/// `scripts/pvisor apply …` rather than a `pvisor` that is not on PATH.
pub fn me() -> String {
    match std::env::var("PVISOR_INVOKED_AS") {
        Ok(name) if !name.trim().is_empty() => shown(name.trim()),
        _ => "pvisor".into(),
    }
}
