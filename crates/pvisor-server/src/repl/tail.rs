//! The splitter that finds a run's end marker in an interpreter's output
//! stream (see [`super`]): output passes on as it comes, only what may
//! begin the marker is held back.

/// The most an end marker's payload (a Python result) may hold.
pub(super) const PAYLOAD_MAX: usize = 4 << 20;

/// What a [`Tail`] found in the bytes pushed to it.
#[derive(Debug, PartialEq)]
pub(super) enum Split {
    Output(Vec<u8>),
    /// The marker's payload (between the marker and the next 0x1e).
    Marker(String),
    /// The marker, whose payload was over [`PAYLOAD_MAX`]: passed over, not
    /// kept. The marker carries the run's secret nonce, so it is the run's
    /// end all the same (a run waiting for another would never end).
    Oversized,
}

/// One output stream of a run: passes output on as it comes (never a split
/// UTF-8 character), holding back only what may be the start of the end
/// marker; memory stays bounded and each byte is searched about once.
#[derive(Debug, Default)]
pub(super) struct Tail {
    pub(super) held: Vec<u8>,
    /// `held` starts with the marker; its payload is still coming.
    at_marker: bool,
    /// An oversized payload is being passed over, up to its closing 0x1e.
    skipping: bool,
}

impl Tail {
    pub(super) fn push(&mut self, bytes: &[u8], marker: &[u8]) -> Vec<Split> {
        if self.skipping {
            if !bytes.contains(&0x1e) {
                return Vec::new();
            }
            self.skipping = false;
            return vec![Split::Oversized];
        }
        let searched_to = self.held.len().saturating_sub(marker.len());
        self.held.extend_from_slice(bytes);
        let mut found = Vec::new();
        let at = if self.at_marker {
            Some(0)
        } else {
            memchr::memmem::find(&self.held[searched_to..], marker).map(|i| i + searched_to)
        };
        self.at_marker = false;
        if let Some(at) = at {
            let after = at + marker.len();
            if marker.last() == Some(&b'\n') {
                // A marker with nothing after it (stderr's).
                if at > 0 {
                    found.push(Split::Output(self.held[..at].to_vec()));
                }
                found.push(Split::Marker(String::new()));
                self.held.clear();
                return found;
            }
            match self.held[after..].iter().position(|b| *b == 0x1e) {
                Some(end) => {
                    if at > 0 {
                        found.push(Split::Output(self.held[..at].to_vec()));
                    }
                    // The limit holds however the payload was cut into
                    // chunks: one that crosses it and ends in the same chunk
                    // is as oversized as one that ends in a later chunk.
                    found.push(if end > PAYLOAD_MAX {
                        Split::Oversized
                    } else {
                        Split::Marker(String::from_utf8_lossy(&self.held[after..after + end]).into_owned())
                    });
                    self.held.clear();
                    return found;
                }
                None if self.held.len() - after <= PAYLOAD_MAX => {
                    // The payload is still coming: send what precedes it.
                    if at > 0 {
                        found.push(Split::Output(self.held.drain(..at).collect()));
                    }
                    self.at_marker = true;
                    return found;
                }
                None => {
                    if at > 0 {
                        found.push(Split::Output(self.held[..at].to_vec()));
                    }
                    self.held.clear();
                    self.skipping = true;
                    return found;
                }
            }
        }
        // Hold back only what may be the marker's beginning (a suffix that
        // is a prefix of it) and an unfinished UTF-8 character; send the rest.
        let keep =
            (1..marker.len().min(self.held.len() + 1)).rev().find(|k| self.held.ends_with(&marker[..*k]));
        let cut = complete_utf8(&self.held[..self.held.len() - keep.unwrap_or(0)]);
        if cut > 0 {
            found.push(Split::Output(self.held.drain(..cut).collect()));
        }
        found
    }

    /// What is left when the stream ends without a marker.
    pub(super) fn rest(&mut self) -> Vec<u8> {
        self.at_marker = false;
        self.skipping = false;
        std::mem::take(&mut self.held)
    }
}

/// The length of the longest prefix of `bytes` that ends on a UTF-8
/// character boundary (an unfinished character at the end is left out).
pub(super) fn complete_utf8(bytes: &[u8]) -> usize {
    let len = bytes.len();
    for back in 1..=len.min(4) {
        let b = bytes[len - back];
        if b & 0xc0 == 0x80 {
            continue; // a continuation byte: look further back
        }
        let width = match b {
            0x00..=0x7f => 1,
            0xc0..=0xdf => 2,
            0xe0..=0xef => 3,
            _ => 4,
        };
        return if back < width { len - back } else { len };
    }
    len
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outputs(found: &[Split]) -> Vec<u8> {
        found
            .iter()
            .filter_map(|s| if let Split::Output(b) = s { Some(b.clone()) } else { None })
            .flatten()
            .collect()
    }

    #[test]
    fn a_marker_split_across_chunks_ends_the_stream_with_its_payload() {
        let marker = b"\x1eabc:";
        let mut tail = Tail::default();
        let mut seen = tail.push(b"line one\nline two\n\x1ea", marker);
        seen.extend(tail.push(b"bc:{\"count\": 1}", marker));
        assert!(!seen.iter().any(|s| matches!(s, Split::Marker(_))), "no marker before its end: {seen:?}");
        seen.extend(tail.push(b"\x1e\n", marker));
        assert_eq!(outputs(&seen), b"line one\nline two\n");
        assert_eq!(seen.last(), Some(&Split::Marker("{\"count\": 1}".into())));
    }

    #[test]
    fn output_without_newlines_is_streamed_and_memory_stays_bounded() {
        let marker = b"\x1enonce\x1e\n";
        let mut tail = Tail::default();
        let mut sent = 0;
        for _ in 0..64 {
            sent += outputs(&tail.push(&[b'x'; 65536], marker)).len();
            assert!(tail.held.len() < marker.len(), "{} bytes held", tail.held.len());
        }
        assert_eq!(sent, 64 * 65536, "everything was streamed before the end");
        let end = tail.push(b"\x1enonce\x1e\n", marker);
        assert_eq!(sent + outputs(&end).len(), 64 * 65536);
        assert_eq!(end.last(), Some(&Split::Marker(String::new())));
    }

    #[test]
    fn a_cut_never_splits_a_utf8_character() {
        let marker = b"\x1en\x1e\n";
        let mut tail = Tail::default();
        let text = "é€😀".repeat(1000);
        let bytes = text.as_bytes();
        let mut sent = Vec::new();
        for chunk in bytes.chunks(7) {
            let out = outputs(&tail.push(chunk, marker));
            assert!(std::str::from_utf8(&out).is_ok(), "a split character was sent");
            sent.extend(out);
        }
        sent.extend(tail.rest());
        assert_eq!(sent, bytes);
    }

    #[test]
    fn a_payload_over_the_limit_is_oversized_even_when_it_ends_in_the_chunk_that_crosses_it() {
        let marker = b"\x1eabc:";
        let mut tail = Tail::default();
        let mut seen = tail.push(b"\x1eabc:", marker);
        let mut big = vec![b'u'; PAYLOAD_MAX + 1];
        big.extend_from_slice(b"\x1e\n");
        seen.extend(tail.push(&big, marker));
        assert_eq!(seen.last(), Some(&Split::Oversized), "{} pieces", seen.len());
        let mut at_limit = Tail::default();
        let mut exact = b"\x1eabc:".to_vec();
        exact.extend(vec![b'u'; PAYLOAD_MAX]);
        exact.extend_from_slice(b"\x1e\n");
        assert!(
            matches!(at_limit.push(&exact, marker).last(), Some(Split::Marker(p)) if p.len() == PAYLOAD_MAX)
        );
    }

    #[test]
    fn an_oversized_payload_still_ends_the_run_and_is_not_kept() {
        let marker = b"\x1eabc:";
        let mut tail = Tail::default();
        let mut seen = tail.push(b"before\x1eabc:{\"result\": \"", marker);
        for _ in 0..80 {
            seen.extend(tail.push(&[b'u'; 65536], marker));
            assert!(tail.held.len() <= PAYLOAD_MAX + 65536, "{} bytes held", tail.held.len());
        }
        assert!(tail.held.is_empty(), "an oversized payload is dropped, not held");
        assert!(!seen.iter().any(|s| matches!(s, Split::Oversized)), "not before its end: {seen:?}");
        seen.extend(tail.push(b"\"}\x1e\n", marker));
        assert_eq!(outputs(&seen), b"before", "the payload is not output");
        assert_eq!(seen.last(), Some(&Split::Oversized));
    }

    #[test]
    fn a_stray_record_separator_is_output_not_a_marker() {
        let marker = b"\x1eabc:";
        let mut tail = Tail::default();
        let found = tail.push(b"a\x1eb\nnext\n\x1ea", marker);
        // Only what may begin the marker waits.
        assert_eq!(outputs(&found), b"a\x1eb\nnext\n");
    }
}
