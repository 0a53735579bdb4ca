//! What an executor tells the user while it works, such as a one-time
//! template build of seconds to minutes: through the embedding binary's own
//! output (so `--json` gets a JSON line), or plainly on stderr when the
//! binary set none.

use std::sync::OnceLock;

static SINK: OnceLock<fn(&str)> = OnceLock::new();

/// Routes every notice through `sink` (set once, first thing in `main`).
pub fn set_sink(sink: fn(&str)) {
    let _ = SINK.set(sink);
}

/// Tells the user `message` (a sentence, without a `pvisor:` prefix).
#[allow(clippy::disallowed_macros)]
pub fn tell(message: &str) {
    match SINK.get() {
        Some(sink) => sink(message),
        None => eprintln!("pvisor: {message}"),
    }
}
