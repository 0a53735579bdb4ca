//! Renew on access (OSEP-0009): a sandbox created with
//! `extensions["access.renew.extend.seconds"]` lives on while it is used.
//!
//! Upstream renews when a request reaches the sandbox through its lifecycle
//! server's proxy; every request to a pvisor sandbox (execd, its endpoints,
//! its egress policy) goes through this daemon, so each authorized one counts.
//! A renewal moves `expiresAt` to `max(now + extend, current)`, as upstream's
//! renew-intent controller does, and at most once a [`MIN_INTERVAL`] (its
//! `min_interval_seconds` default), so a busy client does not write the
//! record on every request.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use pvisor_core::time::Timestamp;

use super::{Daemon, OpError, SandboxState};

/// The extension key, and its bounds: upstream's
/// server/opensandbox_server/extensions/validation.py (300 to 86400 s).
pub const RENEW_KEY: &str = "access.renew.extend.seconds";
const MIN_SECONDS: u64 = 300;
const MAX_SECONDS: u64 = 86_400;
/// The least time between two renewals of one sandbox.
const MIN_INTERVAL: Duration = Duration::from_secs(60);

/// The create request's renew-on-access seconds, validated as upstream
/// validates them (a base-10 integer string from 300 to 86400; an invalid
/// value is a 400 with upstream's message, not ignored).
pub fn renew_extension(extensions: Option<&BTreeMap<String, String>>) -> Result<Option<u64>, OpError> {
    let Some(raw) = extensions.and_then(|e| e.get(RENEW_KEY)) else { return Ok(None) };
    let value = raw.trim();
    if value.is_empty() {
        return Err(OpError::Invalid(format!(
            "Invalid extensions[\"{RENEW_KEY}\"]: empty value; omit the key to disable renew-on-access, or use an integer between {MIN_SECONDS} and {MAX_SECONDS} seconds."
        )));
    }
    let seconds: i64 = value.parse().map_err(|_| {
        OpError::Invalid(format!(
            "Invalid extensions[\"{RENEW_KEY}\"]: must be a base-10 integer string between {MIN_SECONDS} and {MAX_SECONDS}, got {raw:?}."
        ))
    })?;
    match u64::try_from(seconds) {
        Ok(s) if (MIN_SECONDS..=MAX_SECONDS).contains(&s) => Ok(Some(s)),
        _ => Err(OpError::Invalid(format!(
            "Invalid extensions[\"{RENEW_KEY}\"]: must be between {MIN_SECONDS} and {MAX_SECONDS} seconds (5 minutes to 24 hours inclusive), got {seconds}."
        ))),
    }
}

/// The expiry a renewal at `now` gives, or `None` when none is due: the
/// sandbox does not renew on access, has no expiry, or was renewed within
/// [`MIN_INTERVAL`] (its expiry already reaches `now + extend - MIN_INTERVAL`).
fn renewed(extend: Option<u64>, current: Option<SystemTime>, now: SystemTime) -> Option<SystemTime> {
    let (extend, current) = (Duration::from_secs(extend?), current?);
    let candidate = now + extend;
    (current + MIN_INTERVAL < candidate).then_some(candidate)
}

impl Daemon {
    /// Notes an authorized access to sandbox `id`: renews a live one that
    /// asked for it. A failure to renew is logged, never the request's.
    pub fn accessed(&self, id: &str) {
        let Ok(record) = self.get(id) else { return };
        let now = SystemTime::now();
        if renewed(record.renew_on_access, record.expires_at.map(|t| t.system_time()), now).is_none() {
            return;
        }
        let result = self.update(id, |r| {
            let live =
                matches!(r.state, SandboxState::Running | SandboxState::Pending | SandboxState::Resuming);
            let due = renewed(r.renew_on_access, r.expires_at.map(|t| t.system_time()), now);
            if let (true, Some(at)) = (live && !r.deleted, due) {
                r.expires_at = Some(Timestamp::from(at));
                tracing::debug!(sandbox = %id, "renewed on access");
            }
            Ok(())
        });
        if let Err(e) = result {
            tracing::warn!(sandbox = %id, "cannot renew on access: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(value: &str) -> BTreeMap<String, String> {
        BTreeMap::from([(RENEW_KEY.to_owned(), value.to_owned())])
    }

    #[test]
    fn the_extension_is_validated_as_upstream_does() {
        assert_eq!(renew_extension(None).unwrap(), None);
        assert_eq!(renew_extension(Some(&BTreeMap::new())).unwrap(), None);
        assert_eq!(renew_extension(Some(&ext("300"))).unwrap(), Some(300));
        assert_eq!(renew_extension(Some(&ext(" 86400 "))).unwrap(), Some(86_400));
        for (bad, says) in [
            ("10", "got 10."),
            ("86401", "got 86401."),
            ("-5", "got -5."),
            ("1e3", "got \"1e3\""),
            ("", "empty value"),
        ] {
            let err = renew_extension(Some(&ext(bad))).unwrap_err().to_string();
            assert!(err.contains(says) && err.contains(RENEW_KEY), "{bad:?}: {err}");
        }
    }

    #[test]
    fn a_renewal_extends_never_shortens_and_waits_its_interval() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let soon = now + Duration::from_secs(100);
        assert_eq!(renewed(Some(600), Some(soon), now), Some(now + Duration::from_secs(600)));
        let far = now + Duration::from_secs(5000);
        assert_eq!(renewed(Some(600), Some(far), now), None, "max(now + extend, current)");
        let just_renewed = now + Duration::from_secs(590);
        assert_eq!(renewed(Some(600), Some(just_renewed), now), None, "at most once a minute");
        assert_eq!(renewed(None, Some(soon), now), None, "not opted in");
        assert_eq!(renewed(Some(600), None, now), None, "no expiry to move");
    }
}
