//! Crash points for fault-injection tests.
//!
//! `PVISOR_FAILPOINT=<name>` makes the process SIGKILL itself when it reaches
//! that point, exactly as a power cut or the OOM killer would stop it. Only
//! debug builds (what `cargo test` drives) honour it; release builds compile
//! [`hit`] to nothing, so no shipped binary can be told to crash.
//!
//! Points, in finalization order: `after-seal`, `after-bundle`,
//! `after-run-json`, `after-receipt`, `before-terminal-event`; in the vm
//! executor's checkpoints: `vm-after-quiesce`, `vm-after-state`,
//! `vm-after-publish`; in a suspension: `after-termination-receipt`.

/// Stops the process here if the environment names this point (debug builds only).
#[inline]
pub fn hit(name: &str) {
    #[cfg(debug_assertions)]
    if std::env::var_os("PVISOR_FAILPOINT").is_some_and(|v| v == name) {
        // SIGKILL to ourselves: it does not return.
        let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
    }
    #[cfg(not(debug_assertions))]
    let _ = name;
}
