//! Output for a terminal the command does not own: a background run's
//! stdout or stderr on the user's terminal (see `terminal.rs`, [`PipeRelay`]).
//!
//! The terminal acts on what it is sent, for whoever owns it at the time:
//! an OSC 52 string writes the clipboard, a device query (DA, DSR,
//! DECRQSS, a reporting window op) makes the terminal *type* its answer
//! into the foreground job — the user's shell — and SGR 8 (conceal) or a
//! scrolling region could hide pvisor's own summary. So the relay parses
//! the stream (`anstyle-parse`, the VT500 state machine) and passes on only
//! what draws: text, the layout controls (BEL, BS, HT, LF, CR), SGR colours
//! and attributes except conceal, cursor movement and erasure, cursor
//! show/hide, and save/restore cursor. Every string (OSC, DCS, APC, PM,
//! SOS), every query and mode change, character-set switches and C1
//! controls (raw or UTF-8-encoded) are dropped.
//!
//! The parser holds no more of a string than a fixed 1 KiB (its `core`
//! feature): an OSC that never ends must not grow the supervisor's memory
//! with what the command prints.
//!
//! [`PipeRelay`]: super::terminal::PipeRelay

use anstyle_parse::{DefaultCharAccumulator, Params, Parser, Perform};

/// A streaming filter: sequences split across reads are handled.
#[derive(Debug, Default)]
pub(crate) struct Sanitiser {
    parser: Parser<DefaultCharAccumulator>,
}

impl Sanitiser {
    /// Appends what may reach the terminal of `bytes` to `out`.
    pub(crate) fn feed(&mut self, bytes: &[u8], out: &mut Vec<u8>) {
        let mut emit = Emit { out };
        for &byte in bytes {
            self.parser.advance(&mut emit, byte);
        }
    }
}

struct Emit<'a> {
    out: &'a mut Vec<u8>,
}

/// SGR 8: conceal, which would hide what follows (pvisor's summary).
const CONCEAL: u16 = 8;

impl Perform for Emit<'_> {
    fn print(&mut self, c: char) {
        // C1 controls as characters: some terminals act on them.
        if !('\u{80}'..='\u{9f}').contains(&c) {
            let mut utf8 = [0u8; 4];
            self.out.extend_from_slice(c.encode_utf8(&mut utf8).as_bytes());
        }
    }

    fn execute(&mut self, byte: u8) {
        // Not ENQ (it answers back), SO/SI (a character set that garbles
        // what follows) or any C1 control.
        if matches!(byte, 0x07..=0x0a | 0x0d) {
            self.out.push(byte);
        }
    }

    fn csi_dispatch(&mut self, params: &Params, intermediates: &[u8], ignore: bool, action: u8) {
        if ignore {
            return;
        }
        let list: Vec<&[u16]> = params.iter().collect();
        match (intermediates, action) {
            ([], b'm') => {
                let kept = without_conceal(&list);
                // An SGR that only concealed is dropped, not turned into a reset.
                if kept.is_empty() && !list.is_empty() && list != [&[0u16][..]] {
                    return;
                }
                self.csi(b"", &kept, action);
            }
            // Cursor movement, position, erase in display/line, scroll.
            ([], b'A'..=b'H' | b'J' | b'K' | b'S' | b'T' | b'd' | b'f') => self.csi(b"", &list, action),
            // Cursor hide/show (DECTCEM), as progress bars use it.
            ([b'?'], b'h' | b'l') if list == [&[25u16][..]] => self.csi(b"?", &list, action),
            _ => {}
        }
    }

    fn esc_dispatch(&mut self, intermediates: &[u8], ignore: bool, byte: u8) {
        // Save/restore cursor, index, next line, reverse index.
        if !ignore && intermediates.is_empty() && matches!(byte, b'7' | b'8' | b'D' | b'E' | b'M') {
            self.out.extend_from_slice(&[0x1b, byte]);
        }
    }
}

impl Emit<'_> {
    fn csi(&mut self, private: &[u8], params: &[&[u16]], action: u8) {
        self.out.extend_from_slice(b"\x1b[");
        self.out.extend_from_slice(private);
        for (i, param) in params.iter().enumerate() {
            if i > 0 {
                self.out.push(b';');
            }
            for (j, sub) in param.iter().enumerate() {
                if j > 0 {
                    self.out.push(b':');
                }
                self.out.extend_from_slice(sub.to_string().as_bytes());
            }
        }
        self.out.push(action);
    }
}

/// The SGR parameters but conceal; an extended colour (`38;5;8`,
/// `48;2;r;g;b`) is kept whole, so its 8 is not taken for conceal.
fn without_conceal<'p>(list: &[&'p [u16]]) -> Vec<&'p [u16]> {
    let mut kept = Vec::new();
    let mut i = 0;
    while i < list.len() {
        let param = list[i];
        if let [38 | 48 | 58] = param {
            let extra = match list.get(i + 1).and_then(|p| p.first()) {
                Some(5) => 2,
                Some(2) => 4,
                _ => 0,
            };
            let end = (i + 1 + extra).min(list.len());
            kept.extend_from_slice(&list[i..end]);
            i = end;
            continue;
        }
        if param.first() != Some(&CONCEAL) {
            kept.push(param);
        }
        i += 1;
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clean(input: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        Sanitiser::default().feed(input, &mut out);
        out
    }

    #[test]
    fn text_colours_and_layout_pass() {
        let plain = "héllo\tworld\r\n\x1b[1;31mred\x1b[0m \x1b[38;5;8mgrey\x1b[0m \x1b[38;2;1;8;3mrgb\x1b[2K\x1b[3A\x1b[?25l\x1b[?25h\x1b7\x1b8\x07";
        assert_eq!(String::from_utf8(clean(plain.as_bytes())).unwrap(), plain);
        // Re-encoded from the parse: an empty SGR is the reset it means.
        assert_eq!(clean(b"\x1b[mx"), b"\x1b[0mx");
    }

    #[test]
    fn strings_queries_and_conceal_are_dropped() {
        let hostile: &[&[u8]] = &[
            b"\x1b]52;c;ZWNobyBwd25lZA==\x07",      // OSC 52 clipboard, BEL-terminated
            b"\x1b]0;title\x1b\\",                  // OSC title, ST-terminated
            b"\x1bP$qm\x1b\\",                      // DECRQSS
            b"\x1b_apc\x1b\\\x1b^pm\x1b\\",         // APC, PM
            b"\x1b[c\x1b[>c\x1b[5n\x1b[6n\x1b[?6n", // DA, DSR
            b"\x1b[21t\x1b[14t",                    // window ops that report
            b"\x1b[8m\x1b[2;50r\x1b[?1049h",        // conceal, scroll region, alternate screen
            b"\x1b[$p\x1b[?2026$p",                 // DECRQM
            b"\x05\x0e\x0f\x1b(0",                  // ENQ, SO, SI, a character set
        ];
        for input in hostile {
            assert_eq!(clean(input), b"", "{}", String::from_utf8_lossy(input).escape_debug());
        }
        assert_eq!(clean(b"\x1b[1;8;32mx"), b"\x1b[1;32mx");
        // C1 controls as UTF-8 go; what would have been their parameters is plain text.
        assert_eq!(clean("\u{9b}6n\u{9d}52;c;x\u{9c}".as_bytes()), b"6n52;c;x");
    }

    #[test]
    fn sequences_split_across_reads_are_still_caught() {
        let mut filter = Sanitiser::default();
        let mut out = Vec::new();
        for chunk in [&b"a\x1b]5"[..], b"2;c;Zm9v", b"\x07b\x1b[", b"6", b"n\x1b[3", b"2mc"] {
            filter.feed(chunk, &mut out);
        }
        assert_eq!(out, b"ab\x1b[32mc");
    }
}
