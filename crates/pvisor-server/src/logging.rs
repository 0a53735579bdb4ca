//! Diagnostics of the daemon and of the sandbox supervisors it starts:
//! `tracing` events, written to stderr only (stdout carries no logs, and
//! nothing here is written into a record).
//!
//! The filter is `--log-level` when given, else `PVISOR_LOG`, else `info`;
//! both take `EnvFilter` directives (`debug`, `warn,pvisor_server=debug`).
//! The daemon hands its `--log-level` to each supervisor it spawns; without
//! one, the supervisor inherits `PVISOR_LOG` with the rest of the environment.

use tracing_subscriber::EnvFilter;

/// The environment variable read when no `--log-level` is given.
pub const ENV: &str = "PVISOR_LOG";
/// The filter without `--log-level` or `PVISOR_LOG`: the access log,
/// state moves, supervisor starts and exits, warnings and errors.
const DEFAULT: &str = "info";

/// A `--log-level` or `PVISOR_LOG` that is not a filter.
#[derive(Debug, thiserror::Error)]
#[error("invalid log filter {spec:?} (from {from}): {source}")]
pub struct LogError {
    spec: String,
    from: &'static str,
    #[source]
    source: tracing_subscriber::filter::ParseError,
}

/// Installs the stderr logger for this process. A second call keeps the first.
pub fn init(level: Option<&str>) -> Result<(), LogError> {
    let from_env = std::env::var(ENV).ok().filter(|s| !s.trim().is_empty());
    let (spec, from) = match (level, from_env) {
        (Some(level), _) => (level.to_owned(), "--log-level"),
        (None, Some(env)) => (env, ENV),
        (None, None) => (DEFAULT.to_owned(), "the default"),
    };
    let filter = EnvFilter::try_new(&spec).map_err(|source| LogError { spec: spec.clone(), from, source })?;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_bad_filter_is_refused_by_name() {
        let e = super::init(Some("pvisor=loud")).unwrap_err();
        assert!(e.to_string().contains("--log-level"), "{e}");
        assert!(super::init(Some("debug,pvisor_server=trace")).is_ok());
    }
}
