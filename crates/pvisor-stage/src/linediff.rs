//! A bounded line diff, shared by `review --diff` and `apply -p`.
//!
//! Myers' algorithm costs O(N·D): a file rewritten end to end (D ≈ 2N) is
//! quadratic, and the command chooses what it writes. Lines are interned to
//! integers first (one comparison per step instead of a string compare), and
//! the search has a deadline: past it the remaining regions are given as
//! removed-and-added, still a correct diff, only a coarser one, and the diff
//! says so. The hunks are computed once and kept, so the hunks a person
//! chose from are the hunks that are merged.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::time::{Duration, Instant};

use similar::{Algorithm, DiffOp, DiffTag};

/// How long the search may run before it settles for a coarser diff.
pub const DEADLINE: Duration = Duration::from_millis(500);

/// Lines of context around each hunk, as `git add -p` and `diff -u` show.
pub const CONTEXT: usize = 3;

/// The diff of two texts by lines (each line keeps its terminator).
#[derive(Debug, Clone)]
pub struct LineDiff<'a> {
    pub old: Vec<&'a str>,
    pub new: Vec<&'a str>,
    /// Hunks: each a run of ops with up to [`CONTEXT`] equal lines around.
    pub hunks: Vec<Vec<DiffOp>>,
    /// The deadline was reached: some changed regions are shown whole.
    pub coarse: bool,
}

/// Splits at `\n` only: a lone `\r` stays inside its line and is shown escaped.
pub fn lines(text: &str) -> Vec<&str> {
    text.split_inclusive('\n').collect()
}

impl<'a> LineDiff<'a> {
    pub fn new(old: &'a str, new: &'a str) -> Self {
        let (old, new) = (lines(old), lines(new));
        let mut ids: HashMap<&str, u32> = HashMap::new();
        let mut intern = |side: &[&'a str]| -> Vec<u32> {
            side.iter()
                .map(|line| {
                    let next = ids.len() as u32;
                    *ids.entry(line).or_insert(next)
                })
                .collect()
        };
        let (a, b) = (intern(&old), intern(&new));
        let deadline = Instant::now() + DEADLINE;
        // No line in common (a file rewritten end to end): the diff is known
        // without a search, which could only time out.
        let on_old: std::collections::HashSet<u32> = a.iter().copied().collect();
        let ops = if b.iter().any(|id| on_old.contains(id)) {
            similar::capture_diff_slices_deadline(Algorithm::Myers, &a, &b, Some(deadline))
        } else {
            match (a.len(), b.len()) {
                (0, 0) => Vec::new(),
                (0, new_len) => vec![DiffOp::Insert { old_index: 0, new_index: 0, new_len }],
                (old_len, 0) => vec![DiffOp::Delete { old_index: 0, old_len, new_index: 0 }],
                (old_len, new_len) => vec![DiffOp::Replace { old_index: 0, old_len, new_index: 0, new_len }],
            }
        };
        let coarse = Instant::now() >= deadline;
        let hunks = similar::group_diff_ops(ops, CONTEXT);
        Self { old, new, hunks, coarse }
    }

    /// The `@@ -a,b +c,d @@` line of hunk `index`, its line numbers moved
    /// down by `offset` lines (the diff of a region that starts there).
    pub fn header(&self, index: usize, offset: usize) -> Header {
        let ops = &self.hunks[index];
        let (first, last) = (ops[0], ops[ops.len() - 1]);
        let range = |r: Range<usize>, s: Range<usize>| (r.start + offset)..(s.end + offset);
        Header {
            old: range(first.old_range(), last.old_range()),
            new: range(first.new_range(), last.new_range()),
        }
    }

    /// The lines of hunk `index`, in order, each with its sign: removed
    /// lines before the added lines that replace them, as `diff -u` shows.
    pub fn changes(&self, index: usize) -> Vec<(char, &'a str)> {
        let mut out = Vec::new();
        for op in &self.hunks[index] {
            let (tag, old, new) = op.as_tag_tuple();
            match tag {
                DiffTag::Equal => out.extend(self.old[old].iter().map(|l| (' ', *l))),
                DiffTag::Delete => out.extend(self.old[old].iter().map(|l| ('-', *l))),
                DiffTag::Insert => out.extend(self.new[new].iter().map(|l| ('+', *l))),
                DiffTag::Replace => {
                    out.extend(self.old[old].iter().map(|l| ('-', *l)));
                    out.extend(self.new[new].iter().map(|l| ('+', *l)));
                }
            }
        }
        out
    }
}

/// A hunk's line ranges (0-based, end exclusive).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub old: Range<usize>,
    pub new: Range<usize>,
}

impl fmt::Display for Header {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // As diff -u: 1-based; an empty range names the line before it.
        let side = |r: &Range<usize>| {
            let len = r.end - r.start;
            match len {
                1 => format!("{}", r.start + 1),
                0 => format!("{},0", r.start),
                _ => format!("{},{len}", r.start + 1),
            }
        };
        write!(f, "@@ -{} +{} @@", side(&self.old), side(&self.new))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hunks_match_diff_u() {
        let old = "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\n";
        let new = "a\nb\nc\nd\nE\nf\ng\nh\ni\nj\n";
        let d = LineDiff::new(old, new);
        assert_eq!(d.hunks.len(), 1);
        assert_eq!(d.header(0, 0).to_string(), "@@ -2,7 +2,7 @@");
        let shown: Vec<String> = d.changes(0).iter().map(|(s, l)| format!("{s}{l}")).collect();
        assert_eq!(shown.concat(), " b\n c\n d\n-e\n+E\n f\n g\n h\n");
        assert_eq!(LineDiff::new("", "x\n").header(0, 0).to_string(), "@@ -0,0 +1 @@");
        assert_eq!(d.header(0, 10).to_string(), "@@ -12,7 +12,7 @@");
    }

    #[test]
    fn a_rewritten_file_of_150000_lines_is_diffed_in_bounded_time() {
        let old: String = (0..150_000).map(|i| format!("old line {i}\n")).collect();
        let new: String = (0..150_000).map(|i| format!("new line {i}\n")).collect();
        let start = Instant::now();
        let d = LineDiff::new(&old, &new);
        assert!(start.elapsed() < DEADLINE * 6, "took {:?}", start.elapsed());
        let removed =
            (0..d.hunks.len()).flat_map(|h| d.changes(h).into_iter()).filter(|(s, _)| *s == '-').count();
        let added =
            (0..d.hunks.len()).flat_map(|h| d.changes(h).into_iter()).filter(|(s, _)| *s == '+').count();
        assert_eq!((removed, added), (150_000, 150_000));
        // Half the lines kept: a search that must give up, still a whole diff.
        let half: String = (0..150_000)
            .map(|i| if i % 2 == 0 { format!("old line {i}\n") } else { format!("new line {i}\n") })
            .collect();
        let start = Instant::now();
        let d = LineDiff::new(&old, &half);
        assert!(start.elapsed() < DEADLINE * 6, "took {:?}", start.elapsed());
        let added =
            (0..d.hunks.len()).flat_map(|h| d.changes(h).into_iter()).filter(|(s, _)| *s == '+').count();
        assert!(added >= 75_000, "{added}");
    }
}
