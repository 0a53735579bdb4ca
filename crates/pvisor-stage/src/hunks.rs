//! The hunks of a modified text file, for `apply -p`: the regions where the
//! stage's version differs from the host's, each shown as a unified-diff
//! hunk, and the file that results from taking only some of them.
//!
//! The host side is the host's file as it is now; the caller takes hunks only
//! from a path whose host file still equals its conflict baseline, so every
//! hunk's context matches by construction. Merging works on the diff's
//! exact line slices (line endings and a missing final newline included), so
//! taking every hunk gives the staged file byte for byte.

use std::io::{self, Write};

use similar::{DiffOp, DiffTag};

use crate::linediff::{lines, LineDiff};
use crate::review::{self, DIFF_LIMIT};

/// Why a file cannot be split into hunks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotText {
    #[error("binary content (NUL bytes or not UTF-8)")]
    Binary,
    #[error("larger than {} MiB", DIFF_LIMIT >> 20)]
    TooLarge,
}

/// A host file and its staged version, split into hunks once: the hunks
/// shown are the hunks merged, even where the bounded diff is coarse.
#[derive(Debug, Clone)]
pub struct Hunks {
    old: String,
    new: String,
    hunks: Vec<Vec<DiffOp>>,
}

impl Hunks {
    /// Splits `old` (the host's file) against `new` (the staged one).
    pub fn new(old: &[u8], new: &[u8]) -> Result<Self, NotText> {
        if old.len() as u64 > DIFF_LIMIT || new.len() as u64 > DIFF_LIMIT {
            return Err(NotText::TooLarge);
        }
        let text = |b: &[u8]| {
            if b.contains(&0) {
                return Err(NotText::Binary);
            }
            String::from_utf8(b.to_vec()).map_err(|_| NotText::Binary)
        };
        let (old, new) = (text(old)?, text(new)?);
        let hunks = LineDiff::new(&old, &new).hunks;
        Ok(Self { old, new, hunks })
    }

    fn diff(&self) -> LineDiff<'_> {
        LineDiff { old: lines(&self.old), new: lines(&self.new), hunks: self.hunks.clone(), coarse: false }
    }

    /// How many hunks there are.
    pub fn len(&self) -> usize {
        self.hunks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hunks.is_empty()
    }

    /// Writes hunk `index` as `review --diff` shows it (escaped, coloured).
    pub fn write_hunk(&self, out: &mut dyn Write, index: usize, color: bool) -> io::Result<()> {
        if index < self.hunks.len() {
            review::write_hunk(out, &self.diff(), index, 0, color)?;
        }
        Ok(())
    }

    /// The host's file with the hunks whose `chosen` flag is set replaced by
    /// the stage's version of them. Every hunk chosen gives the staged file.
    pub fn merge(&self, chosen: &[bool]) -> Vec<u8> {
        let (old, new) = (lines(&self.old), lines(&self.new));
        let mut out = String::with_capacity(self.old.len().max(self.new.len()));
        let mut pos = 0;
        for (i, hunk) in self.hunks.iter().enumerate() {
            let take = chosen.get(i).copied().unwrap_or(false);
            for op in hunk.iter().filter(|op| op.tag() != DiffTag::Equal) {
                let (from, to) = (op.old_range(), op.new_range());
                out.extend(old[pos..from.start].iter().copied());
                let lines = if take { &new[to] } else { &old[from.clone()] };
                out.extend(lines.iter().copied());
                pos = from.end;
            }
        }
        out.extend(old[pos..].iter().copied());
        out.into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\nk\nl\nm\nn\n";
    const NEW: &str = "A\nb\nc\nd\ne\nf\ng\nh\ni\nj\nk\nl\nm\nN\nadded\n";

    #[test]
    fn every_hunk_gives_the_staged_file_and_none_the_host_file() {
        let h = Hunks::new(OLD.as_bytes(), NEW.as_bytes()).unwrap();
        assert_eq!(h.len(), 2);
        assert_eq!(h.merge(&[true, true]), NEW.as_bytes());
        assert_eq!(h.merge(&[false, false]), OLD.as_bytes());
        assert_eq!(h.merge(&[true, false]), "A\nb\nc\nd\ne\nf\ng\nh\ni\nj\nk\nl\nm\nn\n".as_bytes());
        assert_eq!(h.merge(&[false, true]), "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\nk\nl\nm\nN\nadded\n".as_bytes());
    }

    #[test]
    fn line_endings_and_a_missing_final_newline_survive() {
        let old = "one\r\ntwo\r\nthree";
        let new = "one\r\nTWO\r\nthree\nfour";
        let h = Hunks::new(old.as_bytes(), new.as_bytes()).unwrap();
        let all = vec![true; h.len()];
        assert_eq!(h.merge(&all), new.as_bytes());
        assert_eq!(h.merge(&vec![false; h.len()]), old.as_bytes());
    }

    #[test]
    fn any_choice_of_hunks_of_random_edits_is_exact_at_the_extremes() {
        // Deterministic pseudo-random edits: all-or-nothing must round-trip.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..200 {
            let old: Vec<String> = (0..(next() % 60)).map(|i| format!("line {i}\n")).collect();
            let mut new = old.clone();
            for _ in 0..(next() % 6) {
                let at = (next() as usize) % (new.len() + 1);
                match next() % 3 {
                    0 => new.insert(at, format!("inserted {}\n", next() % 100)),
                    1 if at < new.len() => {
                        new.remove(at);
                    }
                    _ if at < new.len() => new[at] = format!("changed {}\n", next() % 100),
                    _ => {}
                }
            }
            let (old, new) = (old.concat(), new.concat());
            let h = Hunks::new(old.as_bytes(), new.as_bytes()).unwrap();
            assert_eq!(h.merge(&vec![true; h.len()]), new.as_bytes());
            assert_eq!(h.merge(&vec![false; h.len()]), old.as_bytes());
        }
    }

    #[test]
    fn binary_and_huge_files_are_not_split() {
        assert_eq!(Hunks::new(b"a\0b", b"a").unwrap_err(), NotText::Binary);
        assert_eq!(Hunks::new(&[0xff, 0xfe], b"a").unwrap_err(), NotText::Binary);
        let big = vec![b'a'; DIFF_LIMIT as usize + 1];
        assert_eq!(Hunks::new(&big, b"a").unwrap_err(), NotText::TooLarge);
    }
}
