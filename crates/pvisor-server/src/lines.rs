//! Command output cut into stdout/stderr events the way the reference execd
//! cuts it (OpenSandbox `components/execd/pkg/runtime/command_common.go`,
//! `Controller.readFromPos`, at commit 4db3a99): one event per line without
//! its terminator; `\n`, `\r` and `\r\n` each end a line (a progress bar's
//! `\r` segments are separate events); a blank line is the text `"\n"`; an
//! unterminated tail waits for more output and is flushed when the command
//! ends. Clients (the TypeScript SDK, agent frameworks) join events with
//! `"\n"`, so keeping terminators doubles every line break.
//!
//! One difference, for the daemon's memory: a line longer than
//! [`LONGEST_LINE`] is emitted in pieces of that size (the reference holds it
//! whole, reading from a file).

/// The most of one line held before it is emitted anyway.
pub const LONGEST_LINE: usize = 64 << 10;

/// One stream's undelivered partial line.
#[derive(Debug, Default)]
pub struct Lines {
    partial: Vec<u8>,
    /// The last byte was `\r`: a `\n` right after it ends no second line.
    after_cr: bool,
}

impl Lines {
    /// Feeds `bytes`; returns the event texts they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for &b in bytes {
            if b == b'\n' || b == b'\r' {
                if !self.partial.is_empty() {
                    out.push(std::mem::take(&mut self.partial));
                } else if !(b == b'\n' && self.after_cr) {
                    out.push(b"\n".to_vec());
                }
                self.after_cr = b == b'\r';
                continue;
            }
            self.after_cr = false;
            self.partial.push(b);
            if self.partial.len() >= LONGEST_LINE {
                out.push(std::mem::take(&mut self.partial));
            }
        }
        out
    }

    /// The command ended: the unterminated tail, if any.
    pub fn finish(&mut self) -> Option<Vec<u8>> {
        self.after_cr = false;
        (!self.partial.is_empty()).then(|| std::mem::take(&mut self.partial))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(chunks: &[&str]) -> Vec<String> {
        let mut lines = Lines::default();
        let mut out: Vec<Vec<u8>> = chunks.iter().flat_map(|c| lines.push(c.as_bytes())).collect();
        out.extend(lines.finish());
        out.into_iter().map(|t| String::from_utf8(t).unwrap()).collect()
    }

    // The cases of the reference's runtime/command_test.go:
    // TestReadFromPos_SplitsOnCRAndLF, _PreservesBlankLines,
    // _FlushesTrailingLine, _CRLFAcrossPolls, _BlankCRLFAcrossPolls.
    #[test]
    fn lines_lose_their_terminators_and_cr_splits_too() {
        assert_eq!(texts(&["hello\n"]), ["hello"]);
        assert_eq!(texts(&["prog 10%\rprog 20%\r"]), ["prog 10%", "prog 20%"]);
        assert_eq!(texts(&["one\r\ntwo\r\n"]), ["one", "two"]);
    }

    #[test]
    fn blank_lines_are_a_newline() {
        assert_eq!(texts(&["a\n\nb\n"]), ["a", "\n", "b"]);
        assert_eq!(texts(&["c\n\r\nd\n"]), ["c", "\n", "d"]);
        assert_eq!(texts(&["\r"]), ["\n"]);
    }

    #[test]
    fn a_tail_waits_and_is_flushed_at_the_end() {
        let mut lines = Lines::default();
        assert!(lines.push(b"no newline").is_empty());
        assert_eq!(lines.push(b" yet\nrest"), [b"no newline yet".to_vec()]);
        assert_eq!(lines.finish(), Some(b"rest".to_vec()));
    }

    #[test]
    fn crlf_split_across_reads_is_one_terminator() {
        assert_eq!(texts(&["x\r", "\ny\n"]), ["x", "y"]);
        assert_eq!(texts(&["x\n\r", "\ny\n"]), ["x", "\n", "y"]);
    }

    #[test]
    fn a_huge_line_comes_in_bounded_pieces() {
        let mut lines = Lines::default();
        let out = lines.push(&vec![b'a'; LONGEST_LINE * 2 + 5]);
        assert_eq!(out.len(), 2);
        assert_eq!(lines.finish().map(|t| t.len()), Some(5));
    }
}
