//! The changed region of two files too large to diff whole.
//!
//! A one-line change to a 1 GiB log must still be shown: the two files are
//! compared in bounded chunks from the front and from the back, and only
//! what lies between their common prefix and common suffix (cut at line
//! boundaries, with [`CONTEXT`] lines either side) is read into memory, at
//! most [`DIFF_LIMIT`] bytes a side. Memory stays bounded whatever the
//! sizes; a changed region larger than the limit is diffed up to it and the
//! rest is named, never silently dropped.

use std::io;

use pvisor_core::digest::Contents;

use crate::linediff::CONTEXT;
use crate::review::DIFF_LIMIT;

/// Bytes compared per read.
const CHUNK: usize = 1 << 20;

/// What differs between two large texts.
#[derive(Debug, Default)]
pub struct Region {
    /// The bytes of each side's changed region (with context), up to the limit.
    pub old: Vec<u8>,
    pub new: Vec<u8>,
    /// Lines before the region on both sides (the common prefix's).
    pub line: usize,
    /// Bytes of each side's changed region beyond what was read.
    pub cut: (u64, u64),
    /// Both files were read whole (no region was cut out of them).
    pub whole: bool,
}

fn read_exact_at(c: &(impl Contents + ?Sized), buf: &mut [u8], at: u64) -> io::Result<()> {
    if c.read_at(buf, at)? != buf.len() {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the file shrank while being read"));
    }
    Ok(())
}

/// The common prefix's length, its newline count and its last
/// `CONTEXT + 1` newline offsets.
fn common_prefix(
    old: &(impl Contents + ?Sized),
    new: &(impl Contents + ?Sized),
    limit: u64,
) -> io::Result<(u64, usize, Vec<u64>)> {
    let (mut a, mut b) = (vec![0u8; CHUNK], vec![0u8; CHUNK]);
    let (mut at, mut lines, mut recent) = (0u64, 0usize, Vec::new());
    while at < limit {
        let n = (limit - at).min(CHUNK as u64) as usize;
        read_exact_at(old, &mut a[..n], at)?;
        read_exact_at(new, &mut b[..n], at)?;
        let same = a[..n].iter().zip(&b[..n]).position(|(x, y)| x != y).unwrap_or(n);
        let common = &a[..same];
        lines += common.iter().filter(|&&c| c == b'\n').count();
        let tail = common.iter().enumerate().rev().filter(|(_, &c)| c == b'\n').take(CONTEXT + 1);
        let mut latest: Vec<u64> = tail.map(|(i, _)| at + i as u64).collect();
        latest.reverse();
        recent.extend(latest);
        let drop = recent.len().saturating_sub(CONTEXT + 1);
        recent.drain(..drop);
        at += same as u64;
        if same < n {
            break;
        }
    }
    Ok((at, lines, recent))
}

/// The common suffix's length, not reaching back past `floor` on either side.
fn common_suffix(
    old: &(impl Contents + ?Sized),
    new: &(impl Contents + ?Sized),
    (old_len, new_len): (u64, u64),
    floor: u64,
) -> io::Result<u64> {
    let limit = (old_len - floor).min(new_len - floor);
    let (mut a, mut b) = (vec![0u8; CHUNK], vec![0u8; CHUNK]);
    let mut same = 0u64;
    while same < limit {
        let n = (limit - same).min(CHUNK as u64) as usize;
        read_exact_at(old, &mut a[..n], old_len - same - n as u64)?;
        read_exact_at(new, &mut b[..n], new_len - same - n as u64)?;
        let run = a[..n].iter().rev().zip(b[..n].iter().rev()).position(|(x, y)| x != y).unwrap_or(n);
        same += run as u64;
        if run < n {
            break;
        }
    }
    Ok(same)
}

/// How far past `end` (in the common suffix, `suffix` bytes long) the region
/// must reach to end at a line boundary and take `CONTEXT` lines after it.
fn suffix_extension(old: &(impl Contents + ?Sized), end: u64, suffix: u64, aligned: bool) -> io::Result<u64> {
    let want = suffix.min(CHUNK as u64) as usize;
    let mut buf = vec![0u8; want];
    read_exact_at(old, &mut buf, end)?;
    let needed = if aligned { CONTEXT } else { CONTEXT + 1 };
    let ends = buf.iter().enumerate().filter(|(_, &c)| c == b'\n').map(|(i, _)| i as u64 + 1);
    // Fewer line ends than wanted within reach: take what was read.
    Ok(ends.take(needed).nth(needed - 1).unwrap_or(want as u64))
}

fn byte_at(c: &(impl Contents + ?Sized), at: u64) -> io::Result<u8> {
    let mut byte = [0u8];
    read_exact_at(c, &mut byte, at)?;
    Ok(byte[0])
}

/// `len - start` bytes from `start` up to the limit, cut at a line end; and
/// how many bytes were left out.
fn read_side(c: &(impl Contents + ?Sized), start: u64, end: u64) -> io::Result<(Vec<u8>, u64)> {
    let len = end - start;
    let take = len.min(DIFF_LIMIT) as usize;
    let mut buf = vec![0u8; take];
    read_exact_at(c, &mut buf, start)?;
    if (take as u64) < len {
        // Cut at a line end, so the last line shown is whole.
        let keep = buf.iter().rposition(|&c| c == b'\n').map_or(take, |i| i + 1);
        buf.truncate(keep);
    }
    let cut = len - buf.len() as u64;
    Ok((buf, cut))
}

/// The changed region of `old` against `new` (either may be empty).
pub fn changed(old: &(impl Contents + ?Sized), new: &(impl Contents + ?Sized)) -> io::Result<Region> {
    let (old_len, new_len) = (old.size()?, new.size()?);
    let (prefix, lines, recent) = common_prefix(old, new, old_len.min(new_len))?;
    // Start at the beginning of the line `CONTEXT` lines above the first
    // difference (or at the top).
    let (start, line) = if recent.len() > CONTEXT { (recent[0] + 1, lines - CONTEXT) } else { (0, 0) };
    let suffix = common_suffix(old, new, (old_len, new_len), prefix)?;
    let (old_end, new_end) = (old_len - suffix, new_len - suffix);
    let aligned = (old_end == start || byte_at(old, old_end - 1)? == b'\n')
        && (new_end == start || byte_at(new, new_end - 1)? == b'\n');
    let extend = if suffix == 0 { 0 } else { suffix_extension(old, old_end, suffix, aligned)? };
    let (old_bytes, old_cut) = read_side(old, start, old_end + extend)?;
    let (new_bytes, new_cut) = read_side(new, start, new_end + extend)?;
    Ok(Region { old: old_bytes, new: new_bytes, line, cut: (old_cut, new_cut), whole: false })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numbered(n: usize) -> String {
        (0..n).map(|i| format!("line {i}\n")).collect()
    }

    #[test]
    fn one_changed_line_in_a_large_text_is_found_with_its_context() {
        let old = numbered(2_000_000);
        let new = old.replace("line 1234567\n", "return True  # backdoor\n");
        let r = changed(old.as_bytes(), new.as_bytes()).unwrap();
        assert_eq!(r.line, 1_234_564);
        assert_eq!(
            String::from_utf8(r.old).unwrap(),
            "line 1234564\nline 1234565\nline 1234566\nline 1234567\nline 1234568\nline 1234569\nline 1234570\n"
        );
        assert!(String::from_utf8(r.new).unwrap().contains("\nreturn True  # backdoor\nline 1234568\n"));
        assert_eq!(r.cut, (0, 0));
    }

    #[test]
    fn edges_and_insertions() {
        let r = changed(b"a\nb\n".as_slice(), b"a\nb\nc\n".as_slice()).unwrap();
        assert_eq!(
            (r.old.as_slice(), r.new.as_slice(), r.line),
            (b"a\nb\n".as_slice(), b"a\nb\nc\n".as_slice(), 0)
        );
        let r = changed(b"".as_slice(), b"x".as_slice()).unwrap();
        assert_eq!(r.new, b"x");
        let r = changed(b"same\n".as_slice(), b"same\n".as_slice()).unwrap();
        assert_eq!(r.line, 0);
    }

    #[test]
    fn a_region_over_the_limit_is_cut_at_a_line_and_the_rest_counted() {
        let new = numbered(2_000_000);
        let r = changed(b"".as_slice(), new.as_bytes()).unwrap();
        assert!(r.new.len() as u64 <= DIFF_LIMIT && r.new.ends_with(b"\n"));
        assert_eq!(r.new.len() as u64 + r.cut.1, new.len() as u64);
    }
}
