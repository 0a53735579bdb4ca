//! Answers to interactive questions (`apply -i`, `apply -p`): single keys
//! on a terminal, without Enter, or one answer per line from a pipe or file,
//! so every interactive command is scriptable and testable.

use std::io::{BufRead, IsTerminal, Write};

use anyhow::bail;

/// Where answers come from: single keys on a terminal (no Enter), or one
/// answer per line from a pipe or file (its first character), so `apply -i`
/// is scriptable: `printf 'y\nn\n' | pvisor apply -i`.
pub enum Answers {
    Keys(std::fs::File),
    Lines(std::io::Lines<std::io::StdinLock<'static>>),
}

impl Answers {
    pub fn open() -> Self {
        if std::io::stdin().is_terminal() {
            if let Ok(tty) = std::fs::File::open("/dev/stdin") {
                return Self::Keys(tty);
            }
        }
        Self::Lines(std::io::stdin().lock().lines())
    }

    /// The next answer, lower-cased; `None` at end of input. Ctrl-C and
    /// Ctrl-D on a terminal are `q`.
    pub fn next(&mut self) -> anyhow::Result<Option<char>> {
        match self {
            Self::Lines(lines) => {
                Ok(lines.next().transpose()?.map(|l| l.trim().chars().next().unwrap_or('n')))
            }
            Self::Keys(tty) => {
                let key = read_key(tty)?;
                Ok(Some(match key {
                    3 | 4 => 'q',
                    b'\r' | b'\n' => 'n',
                    other => (other as char).to_ascii_lowercase(),
                }))
            }
        }
    }
}

/// Reads one key from the terminal without waiting for Enter: canonical
/// mode, echo and signal keys off for that one read, restored after.
fn read_key(tty: &std::fs::File) -> anyhow::Result<u8> {
    use rustix::termios::{self, LocalModes, OptionalActions, SpecialCodeIndex};
    use std::io::Read;
    let saved = match termios::tcgetattr(tty) {
        Ok(saved) => saved,
        Err(e) => bail!("cannot read the terminal's settings: {}", std::io::Error::from(e)),
    };
    let mut raw = saved.clone();
    raw.local_modes &= !(LocalModes::ICANON | LocalModes::ECHO | LocalModes::ISIG);
    raw.special_codes[SpecialCodeIndex::VMIN] = 1;
    raw.special_codes[SpecialCodeIndex::VTIME] = 0;
    let _ = termios::tcsetattr(tty, OptionalActions::Now, &raw);
    let mut byte = [0u8; 1];
    let read = (&mut &*tty).read(&mut byte);
    // Restores the settings read above.
    let _ = termios::tcsetattr(tty, OptionalActions::Now, &saved);
    match read? {
        0 => Ok(4),
        _ => Ok(byte[0]),
    }
}

/// Asks a yes/no question whose default is no.
pub fn confirm(out: &mut impl Write, answers: &mut Answers, question: &str) -> anyhow::Result<bool> {
    write!(out, "{question} [y/N] ")?;
    out.flush()?;
    let yes = answers.next()? == Some('y');
    writeln!(out, "{}", if yes { "y" } else { "n" })?;
    Ok(yes)
}
