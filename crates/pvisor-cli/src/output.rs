//! Output helpers: where commands write ([`stdout`], [`sink`], captured in
//! tests), pvisor's own messages ([`say`], [`warning`], [`note`]: lines of
//! text, or `--json` lines when the command runs with `--json`; see
//! `crate::json`), and human formatting.

use std::io::Write;

use serde::Serialize;

use crate::json::{JsonType, Message, Stream};

/// Where a command writes what it prints on stdout: the process's stdout,
/// or, in this crate's tests, the calling thread's capture (see
/// [`capture`]), so a test reads a command's output as a user would.
pub fn stdout() -> Sink {
    sink(Stream::Stdout)
}

/// Where a command writes on `stream`: [`stdout`], or stderr for the
/// `--json` lines of `run` (captured in tests as stdout is).
pub fn sink(stream: Stream) -> Sink {
    #[cfg(test)]
    if CAPTURE.with(|c| c.borrow().is_some()) {
        return Sink::Captured(stream);
    }
    match stream {
        Stream::Stdout => Sink::Stdout(std::io::stdout().lock()),
        Stream::Stderr => Sink::Stderr(std::io::stderr().lock()),
    }
}

/// See [`sink`].
pub enum Sink {
    Stdout(std::io::StdoutLock<'static>),
    Stderr(std::io::StderrLock<'static>),
    #[cfg(test)]
    Captured(Stream),
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Self::Stdout(out) => out.write(buf),
            Self::Stderr(err) => err.write(buf),
            #[cfg(test)]
            Self::Captured(stream) => {
                CAPTURE.with(|c| {
                    let mut c = c.borrow_mut();
                    let [out, err] = c.get_or_insert_with(Default::default);
                    match stream {
                        Stream::Stdout => out.extend_from_slice(buf),
                        Stream::Stderr => err.extend_from_slice(buf),
                    }
                });
                Ok(buf.len())
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Self::Stdout(out) => out.flush(),
            Self::Stderr(err) => err.flush(),
            #[cfg(test)]
            Self::Captured(_) => Ok(()),
        }
    }
}

#[cfg(test)]
thread_local! {
    /// What this thread's commands wrote on stdout and (as `--json` lines) stderr.
    static CAPTURE: std::cell::RefCell<Option<[Vec<u8>; 2]>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` with this thread's [`stdout`] captured; returns its result and
/// what it wrote there.
#[cfg(test)]
pub fn capture<T>(f: impl FnOnce() -> T) -> (T, String) {
    let (result, out, _) = capture_both(f);
    (result, out)
}

/// [`capture`], and also what `f` wrote on stderr through [`sink`] (`--json` lines:
/// pvisor's other messages on stderr are not captured).
#[cfg(test)]
pub fn capture_both<T>(f: impl FnOnce() -> T) -> (T, String, String) {
    CAPTURE.with(|c| *c.borrow_mut() = Some(Default::default()));
    let result = f();
    let [out, err] = CAPTURE.with(|c| c.borrow_mut().take()).unwrap_or_default();
    let text = |bytes: Vec<u8>| String::from_utf8_lossy(&bytes).into_owned();
    (result, text(out), text(err))
}

/// Says one of pvisor's own messages: the line `human` on stderr or, while
/// the command runs with `--json`, a `kind` line with `data` on its JSON
/// stream. A message that cannot be written is lost, as a failed
/// `eprintln!` would lose it.
pub fn say<T: Serialize>(kind: JsonType, data: &T, human: impl FnOnce() -> String) {
    if crate::json::mode().is_some() {
        let _ = crate::json::emit(kind, data);
    } else {
        eprintln!("{}", human());
    }
}

/// `pvisor: warning: MESSAGE`, or a `warning` line `{"message": MESSAGE}`.
pub fn warning(message: &str) {
    say(JsonType::Warning, &Message { message }, || format!("pvisor: warning: {message}"));
}

/// `pvisor: note: MESSAGE`, or a `note` line `{"message": MESSAGE}`.
pub fn note(message: &str) {
    say(JsonType::Note, &Message { message }, || format!("pvisor: note: {message}"));
}

/// `pvisor: MESSAGE` (a line that says what it is itself), or a `kind`
/// line `{"message": MESSAGE}`.
pub fn plain(kind: JsonType, message: &str) {
    say(kind, &Message { message }, || format!("pvisor: {message}"));
}

/// The `--json` stream of this process's command line, for notices told
/// from threads other than the command's (whose [`crate::json::mode`] is
/// per thread): set once, by [`route_executor_notices`].
static NOTICES: std::sync::OnceLock<Option<Stream>> = std::sync::OnceLock::new();

/// Routes what the executors tell the user (a one-time vm template build,
/// told from the sandbox's thread): `pvisor: MESSAGE`, or a `note` line on
/// the `--json` stream this process's command line asked for.
pub fn route_executor_notices() {
    let _ = NOTICES.set(crate::json::requested(std::env::args_os()));
    pvisor_sandbox::notice::set_sink(|message| match NOTICES.get().copied().flatten() {
        Some(stream) => {
            let _ = crate::json::json_line(&mut sink(stream), JsonType::Note, &Message { message });
        }
        None => eprintln!("pvisor: {message}"),
    });
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

pub use pvisor_core::records::ending;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_words_quote_only_when_needed() {
        assert_eq!(shell_words("sh", &["-c".into(), "echo 'x' > y".into()]), "sh -c 'echo '\\''x'\\'' > y'");
        assert_eq!(shell_words("true", &[]), "true");
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
