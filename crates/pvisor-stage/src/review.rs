//! Rendering one change for a person: a unified diff for text, sizes and
//! digests for binary files, and one-line summaries for links, modes and
//! directories. Colour is the caller's choice (on a terminal, off in pipes).
//!
//! Names, link targets and contents are untrusted: every one is printed
//! through `pvisor_core::text::escape`, so no byte of a staged file can move
//! the cursor, recolour or hide a line, or reorder text. A text file full of
//! escape sequences is summarised instead of shown.

use std::io::{self, Read, Write};

use similar::{ChangeTag, TextDiff};

use pvisor_core::records::{ChangeEntry, ChangeKind, EntryType};
use pvisor_core::text::{self, Tabs};

use crate::beneath::{Kind, Root};

/// Files larger than this are summarised, not diffed.
pub const DIFF_LIMIT: u64 = 8 * 1024 * 1024;

/// A text side with more escaped characters than this is summarised: it is
/// built to drive a terminal, not to be read.
pub const ESCAPE_LIMIT: usize = 32;

const RED: &str = "\x1b[31m";
const GREEN: &str = "\x1b[32m";
const CYAN: &str = "\x1b[36m";
const BOLD: &str = "\x1b[1m";
const RESET: &str = "\x1b[0m";

/// Reads a file beneath `root` for diffing: `Ok(None)` if absent or not a file.
fn read_side(root: &Root, change: &ChangeEntry) -> io::Result<Option<Vec<u8>>> {
    let rel = change.path.as_path();
    match root.stat(rel)? {
        Some(st) if st.kind == Kind::File => {
            if st.size > DIFF_LIMIT {
                return Ok(None);
            }
            let mut buf = Vec::with_capacity(st.size as usize);
            root.open_file(rel)?.read_to_end(&mut buf)?;
            Ok(Some(buf))
        }
        _ => Ok(None),
    }
}

fn is_binary(bytes: &[u8]) -> bool {
    bytes[..bytes.len().min(8192)].contains(&0) || std::str::from_utf8(bytes).is_err()
}

/// One line instead of a diff: sizes and digests of both sides.
fn summarise(out: &mut dyn Write, what: &str, old: &[u8], new: &[u8]) -> io::Result<()> {
    let digest = |b: &[u8]| blake3::hash(b).to_hex().to_string();
    writeln!(
        out,
        "  {what}: {} bytes (blake3 {}) => {} bytes (blake3 {})",
        old.len(),
        &digest(old)[..16],
        new.len(),
        &digest(new)[..16]
    )
}

/// Writes the diff of `change`: the workspace (`ws`) now versus the stage (`upper`).
pub fn write_diff(
    out: &mut dyn Write,
    ws: &Root,
    upper: &Root,
    change: &ChangeEntry,
    color: bool,
) -> io::Result<()> {
    let name = change.path.display_escaped();
    let paint = |code: &'static str| if color { code } else { "" };
    let reset = paint(RESET);
    writeln!(out, "{}diff {} ({}){reset}", paint(BOLD), name, change.kind.as_str())?;
    let host_stat = ws.stat(change.path.as_path())?;
    let old = read_side(ws, change)?;
    let new = if change.entry == EntryType::File { read_side(upper, change)? } else { None };
    match change.entry {
        EntryType::Symlink => {
            let target = upper.read_link(change.path.as_path())?;
            let before = match host_stat.map(|s| s.kind) {
                Some(Kind::Symlink) => {
                    format!("-> {}", text::escape_bytes(&ws.read_link(change.path.as_path())?, Tabs::Escape))
                }
                Some(_) => "(not a symlink)".into(),
                None => "(absent)".into(),
            };
            writeln!(out, "  symlink: {before}  =>  -> {}", text::escape_bytes(&target, Tabs::Escape))?;
            return Ok(());
        }
        EntryType::Dir => {
            let what = match change.kind {
                ChangeKind::OpaqueDir => "directory replaced wholesale: entries not in the stage are removed",
                ChangeKind::ModeChanged => "directory permissions changed",
                ChangeKind::TypeChanged => "becomes a directory",
                ChangeKind::Added | ChangeKind::Modified | ChangeKind::Deleted | ChangeKind::Symlink => {
                    "new directory"
                }
            };
            writeln!(out, "  {what} (mode {:o})", change.mode)?;
            return Ok(());
        }
        EntryType::Special => {
            writeln!(out, "  special file (device, fifo or socket): never applied")?;
            return Ok(());
        }
        EntryType::None | EntryType::File => {}
    }
    if let Some(st) = host_stat {
        if change.kind == ChangeKind::ModeChanged
            || (st.kind == Kind::File && change.entry == EntryType::File && st.mode != change.mode)
        {
            writeln!(out, "  mode {:o} => {:o}", st.mode, change.mode)?;
        }
    }
    if change.kind == ChangeKind::ModeChanged {
        return Ok(());
    }
    let (old, new) = match (old, new, change.entry) {
        (old, None, EntryType::File) => {
            writeln!(
                out,
                "  file of {} bytes (over {} MiB, not diffed), blake3 {}",
                change.size,
                DIFF_LIMIT >> 20,
                change.blake3.as_deref().unwrap_or("-")
            )?;
            let _ = old;
            return Ok(());
        }
        (old, new, _) => (old.unwrap_or_default(), new.unwrap_or_default()),
    };
    if is_binary(&old) || is_binary(&new) {
        return summarise(out, "binary", &old, &new);
    }
    let (old, new) = (String::from_utf8_lossy(&old), String::from_utf8_lossy(&new));
    let escapes =
        text::count_unsafe(&old.replace("\r\n", "\n")) + text::count_unsafe(&new.replace("\r\n", "\n"));
    if escapes > ESCAPE_LIMIT {
        let what =
            format!("text with {escapes} control or formatting characters (escape sequences), not shown");
        return summarise(out, &what, old.as_bytes(), new.as_bytes());
    }
    let diff = TextDiff::from_lines(old.as_ref(), new.as_ref());
    let a = if host_stat.is_some() { format!("a/{name}") } else { "/dev/null".into() };
    let b = if change.entry == EntryType::None { "/dev/null".into() } else { format!("b/{name}") };
    writeln!(out, "{}--- {a}{reset}", paint(BOLD))?;
    writeln!(out, "{}+++ {b}{reset}", paint(BOLD))?;
    let unified = diff.unified_diff();
    for hunk in unified.iter_hunks() {
        write_hunk(out, &hunk, color)?;
    }
    Ok(())
}

/// Writes one hunk: its `@@` header and its lines, escaped so no byte of the
/// staged text can drive the terminal, coloured when `color`.
pub fn write_hunk<'text>(
    out: &mut dyn Write,
    hunk: &similar::udiff::UnifiedDiffHunk<'_, 'text, 'text, '_, str>,
    color: bool,
) -> io::Result<()> {
    let paint = |code: &'static str| if color { code } else { "" };
    let reset = paint(RESET);
    writeln!(out, "{}{}{reset}", paint(CYAN), hunk.header())?;
    for line in hunk.iter_changes() {
        let (sign, code) = match line.tag() {
            ChangeTag::Delete => ('-', paint(RED)),
            ChangeTag::Insert => ('+', paint(GREEN)),
            ChangeTag::Equal => (' ', ""),
        };
        let value = line.value();
        // A CRLF line ending cannot hide anything; any other CR (the
        // diff splits lines at a lone CR too) is shown as `\r`.
        let value = value.strip_suffix("\r\n").or_else(|| value.strip_suffix('\n')).unwrap_or(value);
        let shown = text::escape(value, Tabs::Keep);
        let end = if code.is_empty() { "" } else { reset };
        writeln!(out, "{code}{sign}{shown}{end}")?;
        if line.missing_newline() {
            writeln!(out, "\\ No newline at end of file")?;
        }
    }
    Ok(())
}
