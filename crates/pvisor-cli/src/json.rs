//! `--json` output: the closed list of line types the binary prints
//! ([`JsonType`], each documented in `docs/cli-reference.md`, which a test
//! holds to this list), the envelope every line is ([`json_line`]), and where
//! pvisor's own messages go while a command runs with `--json` ([`scoped`],
//! [`mode`]).
//!
//! A line is `{"type": KIND, "data": RECORD}`: `type` names the record and
//! `data` is the record itself (ripgrep's envelope), so a record's own `type`
//! field survives. Read commands print records on stdout. The commands that
//! change something (`run`, `apply`, `kill`, …) print, with `--json`, every
//! message of pvisor's own as a line too, and end with exactly one `result`
//! line, or one `error` line when they failed: on stderr for `run`, `fork`
//! and `resume` (stdout is the command's), on stdout for the others.

use std::cell::Cell;
use std::ffi::OsString;
use std::io::Write;

use anyhow::Context;
use serde::Serialize;

/// One of the process's two output streams: where a command's `--json`
/// lines go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Declares [`JsonType`] with its names and [`JSON_TYPES`] from one list,
/// so no type can be printed without being listed (and documented).
macro_rules! json_types {
    ($($(#[doc = $doc:literal])* $variant:ident = $name:literal,)*) => {
        /// The type of a `--json` line: every line the binary prints names
        /// one of these, and `docs/cli-reference.md` documents each.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum JsonType {
            $($(#[doc = $doc])* $variant,)*
        }

        impl JsonType {
            /// Every type, in the order listed.
            pub const ALL: &'static [JsonType] = &[$(JsonType::$variant,)*];

            /// The name printed as the line's `type`.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(JsonType::$variant => $name,)*
                }
            }
        }

        /// The name of every [`JsonType`].
        pub const JSON_TYPES: &[&str] = &[$($name,)*];
    };
}

json_types! {
    /// `status`: a Job's status.
    Status = "status",
    /// `review`, `status --review`: one staged change.
    Change = "change",
    /// `events`: one record of the Trace.
    Event = "event",
    /// `jobs`: one Job.
    Job = "job",
    /// `checkpoints`, `checkpoint --kind execution`, `suspend`: a checkpoint manifest.
    Checkpoint = "checkpoint",
    /// `doctor`: one check.
    Check = "check",
    /// `gc`: an item freed (or that would be).
    Freed = "freed",
    /// `gc`: an item kept, with why.
    Kept = "kept",
    /// `gc`: an item that could not be freed.
    Failed = "failed",
    /// `cache ls`: one cache.
    Cache = "cache",
    /// `review --state`, `state approve`: one agent state change.
    State = "state",
    /// `trust --list`: one trusted file.
    Trusted = "trusted",
    /// `image ls`: one image.
    Image = "image",
    /// `image templates`: one vm template.
    Template = "template",
    /// A failure: the last line of a command that failed (and, in `jobs`,
    /// a Job whose records cannot be read).
    Error = "error",
    /// The last line of a command that changed something: what it did.
    Result = "result",
    /// One of pvisor's warnings.
    Warning = "warning",
    /// One of pvisor's notes.
    Note = "note",
    /// `run`, `fork`: the network policy, when it is not the default.
    Policy = "policy",
    /// `run --timings`: where the run's time went, phase by phase.
    Timings = "timings",
    /// `run --agent`: what the agent preset granted.
    Agent = "agent",
    /// `run`, `fork`, `resume`: what the command did on the network.
    Network = "network",
    /// `run`, `fork`, `resume`: the commands that usually come next.
    Next = "next",
    /// `fork`: the Job and checkpoint a fork starts from.
    Fork = "fork",
    /// `apply`: a path applied.
    Applied = "applied",
    /// `apply --dry-run`: a path that would be applied.
    Planned = "planned",
    /// `apply`: a selected path not applied, with why.
    Skipped = "skipped",
    /// `apply`: a branch or tag a commit made in the sandbox moved (or, in
    /// a dry run, would move).
    Commit = "commit",
    /// `drop`: a change discarded.
    Dropped = "dropped",
    /// `status --session`: the session and its runs; `run --session`: the
    /// session a run joins; `apply`, `drop --session`: the session ended.
    Session = "session",
}

/// One `--json` line: what kind of record it is, and the record untouched.
#[derive(Serialize)]
struct Envelope<'a, T> {
    r#type: &'static str,
    data: &'a T,
}

/// Writes `value` as one JSON line, `{"type": kind, "data": value}`.
pub fn json_line<T: Serialize>(out: &mut impl Write, kind: JsonType, value: &T) -> anyhow::Result<()> {
    let line = serde_json::to_vec(&Envelope { r#type: kind.as_str(), data: value })
        .context("cannot encode JSON output")?;
    out.write_all(&line).context("cannot write output")?;
    out.write_all(b"\n").context("cannot write output")?;
    Ok(())
}

/// A message of pvisor's own (a `warning` or a `note`): its text.
#[derive(Debug, Serialize)]
pub struct Message<'a> {
    pub message: &'a str,
}

thread_local! {
    /// The stream the running command's `--json` lines go to (`None`
    /// without `--json`). Per thread, so tests running commands side by
    /// side do not see each other's.
    static MODE: Cell<Option<Stream>> = const { Cell::new(None) };
}

/// Where the running command writes its `--json` lines; `None` when it
/// was not given `--json` (pvisor's own messages are then lines of text).
pub fn mode() -> Option<Stream> {
    MODE.with(Cell::get)
}

/// Writes one line on the running command's `--json` stream, if it has one.
pub fn emit<T: Serialize>(kind: JsonType, value: &T) -> anyhow::Result<()> {
    match mode() {
        Some(stream) => json_line(&mut crate::output::sink(stream), kind, value),
        None => Ok(()),
    }
}

/// Puts the previous mode back when a [`scoped`] command ends.
struct Restore(Option<Stream>);

impl Drop for Restore {
    fn drop(&mut self) {
        MODE.with(|m| m.set(self.0));
    }
}

/// Runs `command` with `--json` lines on `stream`: pvisor's own messages
/// become lines there, and an error `command` returns becomes its last line,
/// `error` (see [`crate::exit::report_json`]), with pvisor's exit status.
pub fn scoped(stream: Stream, command: impl FnOnce() -> anyhow::Result<i32>) -> anyhow::Result<i32> {
    let _restore = Restore(MODE.with(|m| m.replace(Some(stream))));
    match command() {
        Ok(code) => Ok(code),
        Err(err) => Ok(crate::exit::report_json(&err)),
    }
}

/// The stream a command line that asks for `--json` (before any `--`)
/// writes it to: stderr for `run`, `fork` and `resume`, whose stdout is the
/// command's, else stdout. `None` without `--json`. For errors found
/// before the command line parses.
pub fn requested(args: impl IntoIterator<Item = OsString>) -> Option<Stream> {
    let words: Vec<OsString> = args.into_iter().skip(1).take_while(|w| w != "--").collect();
    if !words.iter().any(|w| w == "--json") {
        return None;
    }
    let command = words.iter().find(|w| !w.to_string_lossy().starts_with('-'));
    Some(match command.and_then(|c| c.to_str()) {
        Some("run" | "fork" | "resume") => Stream::Stderr,
        _ => Stream::Stdout,
    })
}

/// Why a command run with `--json` refused to start.
#[derive(Debug, thiserror::Error)]
pub enum JsonRefusal {
    /// `apply -i`/`-p` asks questions, and a `--json` reader cannot answer.
    #[error(
        "apply --json asks no questions, so it takes no {flag}: name the paths to apply (or pass --all), \
         with --force to overwrite conflicts and --include-sensitive for sensitive paths you have reviewed"
    )]
    Interactive { flag: &'static str },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lines_wrap_the_record_in_an_envelope() {
        let mut out = Vec::new();
        json_line(&mut out, JsonType::Event, &serde_json::json!({"type": "run.started", "seq": 1})).unwrap();
        let line: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(line, serde_json::json!({"type": "event", "data": {"type": "run.started", "seq": 1}}));
        assert!(out.ends_with(b"}\n"));
        assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), 1);
    }

    #[test]
    fn a_test_reads_what_a_command_wrote_to_stdout() {
        use crate::output::{capture, stdout};
        let ((), text) =
            capture(|| json_line(&mut stdout(), JsonType::Job, &serde_json::json!({"n": 1})).unwrap());
        assert_eq!(text, "{\"type\":\"job\",\"data\":{\"n\":1}}\n");
    }

    #[test]
    fn every_type_has_one_name() {
        assert_eq!(JsonType::ALL.len(), JSON_TYPES.len());
        for (kind, name) in JsonType::ALL.iter().zip(JSON_TYPES) {
            assert_eq!(kind.as_str(), *name);
        }
        let mut names = JSON_TYPES.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), JSON_TYPES.len(), "a name is given twice");
    }

    /// `docs/cli-reference.md` documents every type the binary can print,
    /// in its table of `--json` line types, and no type it cannot.
    #[test]
    fn the_cli_reference_documents_every_json_type_and_no_other() {
        let doc = include_str!("../../../docs/cli-reference.md");
        let documented = documented_types(doc);
        for name in JSON_TYPES {
            assert!(
                documented.iter().any(|d| d == name),
                "docs/cli-reference.md does not document the `{name}` line"
            );
        }
        for name in &documented {
            assert!(
                JSON_TYPES.contains(&name.as_str()),
                "docs/cli-reference.md documents `{name}`, which nothing prints"
            );
        }
    }

    /// The types named in the first column of the table under
    /// `## --json lines`: rows that start with "| `NAME` |".
    fn documented_types(doc: &str) -> Vec<String> {
        let section =
            doc.split("\n## --json lines\n").nth(1).expect("docs/cli-reference.md has no `## --json lines`");
        let section = section.split("\n## ").next().unwrap_or(section);
        section
            .lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .filter_map(|l| l.split_once("` |").map(|(name, _)| name.to_owned()))
            .collect()
    }

    #[test]
    fn json_is_requested_before_the_separator_on_the_commands_stream() {
        let args = |words: &[&str]| words.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(requested(args(&["pvisor", "run", "--json", "--", "true"])), Some(Stream::Stderr));
        assert_eq!(requested(args(&["pvisor", "fork", "job-1", "--json"])), Some(Stream::Stderr));
        assert_eq!(requested(args(&["pvisor", "apply", "--all", "--json"])), Some(Stream::Stdout));
        assert_eq!(requested(args(&["pvisor", "run", "--", "jq", "--json"])), None);
        assert_eq!(requested(args(&["pvisor", "status"])), None);
    }
}
