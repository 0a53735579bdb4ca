//! Rendering one change for a person: a unified diff for text, sizes and
//! digests for binary files, and one-line summaries for links, modes and
//! directories. Colour is the caller's choice (on a terminal, off in pipes).
//!
//! Names, link targets and contents are untrusted: every one is printed
//! through `pvisor_core::text::escape`, so no byte of a staged file can move
//! the cursor, recolour or hide a line, or reorder text. A text diff is
//! always shown, however many such characters it holds: each is shown
//! escaped (`\u{200b}`) where it stands, never withheld. A file too large to
//! read whole is diffed over its changed region (see `region`), and the
//! diff is bounded in time (see `linediff`) and in output ([`OUTPUT_LIMIT`]).

use std::io::{self, Read, Write};

use pvisor_core::records::{ChangeEntry, ChangeKind, EntryType};
use pvisor_core::text::{self, Tabs};

use crate::beneath::{Kind, Root, Stat};
use crate::linediff::LineDiff;
use crate::region::{self, Region};

/// Files up to this size are read whole and diffed; larger ones are diffed
/// over their changed region (see `region`), at most this much a side.
pub const DIFF_LIMIT: u64 = 8 * 1024 * 1024;

/// A file's diff stops after this many bytes of output, saying what it left out.
pub const OUTPUT_LIMIT: usize = 16 * 1024 * 1024;

const RED: &str = "\x1b[31m";
const GREEN: &str = "\x1b[32m";
const CYAN: &str = "\x1b[36m";
const BOLD: &str = "\x1b[1m";
const RESET: &str = "\x1b[0m";

/// The changed region of the host file against the staged one; a side that
/// is absent or not a regular file counts as empty.
fn changed_region(ws: &Root, upper: &Root, change: &ChangeEntry, host: Option<Stat>) -> io::Result<Region> {
    let rel = change.path.as_path();
    let old = host.filter(|s| s.kind == Kind::File).map(|_| ws.open_file(rel)).transpose()?;
    let new = (change.entry == EntryType::File).then(|| upper.open_file(rel)).transpose()?;
    let size = |f: &Option<std::fs::File>| f.as_ref().map_or(Ok(0), |f| f.metadata().map(|m| m.len()));
    if size(&old)? <= DIFF_LIMIT && size(&new)? <= DIFF_LIMIT {
        let read = |f: Option<std::fs::File>| -> io::Result<Vec<u8>> {
            let mut buf = Vec::new();
            if let Some(f) = f {
                // Bounded even if the file grew since it was measured.
                f.take(DIFF_LIMIT).read_to_end(&mut buf)?;
            }
            Ok(buf)
        };
        return Ok(Region { old: read(old)?, new: read(new)?, line: 0, cut: (0, 0), whole: true });
    }
    let empty: &[u8] = &[];
    match (&old, &new) {
        (Some(o), Some(n)) => region::changed(o, n),
        (Some(o), None) => region::changed(o, empty),
        (None, Some(n)) => region::changed(empty, n),
        (None, None) => region::changed(empty, empty),
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

/// Writes the diff of `change`: the workspace (`ws`) now versus the stage
/// (`upper`). `confusable`: why its name could be mistaken for another
/// (see [`crate::names`]), said under the header.
pub fn write_diff(
    out: &mut dyn Write,
    ws: &Root,
    upper: &Root,
    change: &ChangeEntry,
    confusable: Option<&str>,
    color: bool,
) -> io::Result<()> {
    let name = change.path.display_escaped();
    let paint = |code: &'static str| if color { code } else { "" };
    let reset = paint(RESET);
    writeln!(out, "{}diff {} ({}){reset}", paint(BOLD), name, change.kind.as_str())?;
    if let Some(reason) = confusable {
        writeln!(out, "  CONFUSABLE NAME: {reason}")?;
    }
    let host_stat = ws.stat(change.path.as_path())?;
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
                ChangeKind::OpaqueDir => {
                    "directory replaced wholesale: each host entry it does not re-create is removed, and listed as deleted"
                }
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
    if let Some(first) = &change.hardlink_of {
        writeln!(
            out,
            "  hard link of {}: applied as another name of the same file",
            first.display_escaped()
        )?;
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
    let region = changed_region(ws, upper, change, host_stat)?;
    if is_binary(&region.old) || is_binary(&region.new) {
        if region.whole {
            return summarise(out, "binary", &region.old, &region.new);
        }
        let host_size = host_stat.filter(|s| s.kind == Kind::File).map_or(0, |s| s.size);
        let staged_size = if change.entry == EntryType::File { change.size } else { 0 };
        return writeln!(
            out,
            "  binary, over {} MiB: {host_size} bytes => {staged_size} bytes (blake3 {})",
            DIFF_LIMIT >> 20,
            change.blake3.as_deref().unwrap_or("-")
        );
    }
    let (old, new) = (String::from_utf8_lossy(&region.old), String::from_utf8_lossy(&region.new));
    let a = if host_stat.is_some() { format!("a/{name}") } else { "/dev/null".into() };
    let b = if change.entry == EntryType::None { "/dev/null".into() } else { format!("b/{name}") };
    writeln!(out, "{}--- {a}{reset}", paint(BOLD))?;
    writeln!(out, "{}+++ {b}{reset}", paint(BOLD))?;
    let diff = LineDiff::new(&old, &new);
    let mut written = Counted { out, bytes: 0 };
    for index in 0..diff.hunks.len() {
        if written.bytes > OUTPUT_LIMIT {
            let left = diff.hunks.len() - index;
            writeln!(written.out, "  ... diff cut after {} MiB of output: {left} more hunks not shown; `pvisor apply --dry-run` and the staged file itself hold the rest", OUTPUT_LIMIT >> 20)?;
            break;
        }
        write_hunk(&mut written, &diff, index, region.line, color)?;
    }
    if diff.coarse {
        writeln!(out, "  (diff computed coarsely: its time limit was reached, so some unchanged lines show as removed and added again)")?;
    }
    let (old_cut, new_cut) = region.cut;
    if old_cut > 0 || new_cut > 0 {
        writeln!(out, "  ... the changed region goes on past the {} MiB shown: {old_cut} more bytes on the host, {new_cut} more staged, not shown", DIFF_LIMIT >> 20)?;
    }
    Ok(())
}

/// Counts the bytes written through it, to bound a diff's output.
struct Counted<'a> {
    out: &'a mut dyn Write,
    bytes: usize,
}

impl Write for Counted<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out.write(buf)?;
        self.bytes += n;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// Writes hunk `index` of `diff`: its `@@` header (line numbers moved down
/// by `offset`) and its lines, escaped so no byte of the staged text can
/// drive the terminal or hide a line, coloured when `color`.
pub fn write_hunk(
    out: &mut dyn Write,
    diff: &LineDiff<'_>,
    index: usize,
    offset: usize,
    color: bool,
) -> io::Result<()> {
    let paint = |code: &'static str| if color { code } else { "" };
    let reset = paint(RESET);
    writeln!(out, "{}{}{reset}", paint(CYAN), diff.header(index, offset))?;
    for (sign, value) in diff.changes(index) {
        let code = match sign {
            '-' => paint(RED),
            '+' => paint(GREEN),
            _ => "",
        };
        // A CRLF line ending cannot hide anything; any other CR is shown as `\r`.
        let line = value.strip_suffix("\r\n").or_else(|| value.strip_suffix('\n')).unwrap_or(value);
        let shown = text::escape(line, Tabs::Keep);
        let end = if code.is_empty() { "" } else { reset };
        writeln!(out, "{code}{sign}{shown}{end}")?;
        if !value.ends_with('\n') {
            writeln!(out, "\\ No newline at end of file")?;
        }
    }
    Ok(())
}
