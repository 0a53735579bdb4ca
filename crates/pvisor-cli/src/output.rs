//! Output helpers: JSON Lines records and human formatting.
//!
//! `--json` output is one object per line with a `type` field naming the
//! record (`status`, `event`, …) beside its data fields; see
//! `docs/cli-reference.md`.

use std::io::Write;

use anyhow::Context;
use serde::Serialize;

/// Writes `value` as one JSON line, with a `"type": kind` field added.
pub fn json_line<T: Serialize>(out: &mut impl Write, kind: &str, value: &T) -> anyhow::Result<()> {
    let mut object = serde_json::Map::new();
    object.insert("type".into(), kind.into());
    match serde_json::to_value(value).context("cannot encode JSON output")? {
        serde_json::Value::Object(fields) => object.extend(fields),
        other => {
            object.insert("data".into(), other);
        }
    }
    serde_json::to_writer(&mut *out, &object).context("cannot write output")?;
    out.write_all(b"\n").context("cannot write output")?;
    Ok(())
}

/// Quotes a command line for display, shell-style.
pub fn shell_words(program: &str, args: &[String]) -> String {
    let quoted = std::iter::once(program)
        .chain(args.iter().map(String::as_str))
        .map(|w| {
            if !w.is_empty() && w.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b)) {
                w.to_owned()
            } else {
                format!("'{}'", w.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ");
    // Quoting keeps the words apart; escaping keeps the terminal safe.
    pvisor_core::text::escape(&quoted, pvisor_core::text::Tabs::Escape).into_owned()
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
    fn json_lines_carry_a_type_field() {
        let mut out = Vec::new();
        json_line(&mut out, "status", &serde_json::json!({"job": "j"})).unwrap();
        let line: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(line, serde_json::json!({"type": "status", "job": "j"}));
        assert!(out.ends_with(b"}\n"));
    }
}
