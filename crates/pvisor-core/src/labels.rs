//! Job labels: `key=value` pairs a frontend attaches to a Job at admission
//! (the containerd shim's container id and namespace, `pvisor run --label`),
//! kept in `job.json` and `job.created`, shown by `pvisor status` and
//! `pvisor jobs`, and matched by `pvisor jobs --label`.
//!
//! Read commands print them, so both halves are checked at admission: a
//! key is Kubernetes' shape (an optional DNS-style prefix and `/`, then a
//! name of letters, digits, `-`, `_` and `.`, starting and ending with a
//! letter or digit), a value has no control or text-reordering characters
//! ([`crate::text::is_unsafe`]). A record changed behind pvisor's back is
//! still printed through [`crate::text::escape`].

use std::collections::BTreeMap;

/// A Job's labels, ordered by key (one value per key).
pub type Labels = BTreeMap<String, String>;

/// At most this many labels per Job.
pub const MAX_LABELS: usize = 64;
const MAX_PREFIX: usize = 253;
const MAX_NAME: usize = 63;
const MAX_VALUE: usize = 1024;

/// A label that cannot be recorded, with what to do instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    #[error("label {0:?} is not KEY=VALUE (for example --label team=infra)")]
    NotKeyValue(String),
    #[error(
        "label key {0:?} is invalid: use letters, digits, '-', '_' and '.', starting and ending with a letter \
         or digit (at most {MAX_NAME}), optionally after a prefix and '/' (such as containerd.io/container)"
    )]
    Key(String),
    #[error("the value of label {0:?} is invalid: at most {MAX_VALUE} bytes, without control characters")]
    Value(String),
    #[error("too many labels: at most {MAX_LABELS}")]
    TooMany,
    #[error("label key {0:?} is reserved: pvisor's frontends set keys under {1:?} themselves; choose another prefix")]
    Reserved(String, &'static str),
}

/// Key prefixes the frontends own: `pvisor serve` finds its sandboxes' Jobs
/// by `pvisor.serve/sandbox` (and stops a live one it has no record of),
/// the containerd shim records its namespace, container and the CRI's pod
/// under the others. A user's label never takes one.
pub const RESERVED_PREFIXES: &[&str] = &["pvisor.serve/", "containerd.io/", "io.kubernetes."];

/// The labels the containerd shim gives a container's Job: its containerd
/// namespace and container id (under a reserved prefix, so no user's Job
/// carries them).
pub const CONTAINERD_NAMESPACE: &str = "containerd.io/namespace";
pub const CONTAINERD_CONTAINER: &str = "containerd.io/container";
/// The CRI plugin's pod name and Kubernetes namespace, where it set them.
pub const CRI_POD_NAME: &str = "io.kubernetes.cri.sandbox-name";
pub const CRI_POD_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";

/// The containerd container a Job is, read from its labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerdContainer<'a> {
    pub namespace: &'a str,
    pub container: &'a str,
    /// The Kubernetes pod and its namespace, when CRI created it.
    pub pod: Option<(&'a str, &'a str)>,
}

/// The containerd container a Job with `labels` is, if a shim runs it.
pub fn containerd_container(labels: &Labels) -> Option<ContainerdContainer<'_>> {
    let pod = match (labels.get(CRI_POD_NAME), labels.get(CRI_POD_NAMESPACE)) {
        (Some(name), Some(namespace)) => Some((name.as_str(), namespace.as_str())),
        _ => None,
    };
    Some(ContainerdContainer {
        namespace: labels.get(CONTAINERD_NAMESPACE)?,
        container: labels.get(CONTAINERD_CONTAINER)?,
        pod,
    })
}

/// Parses a label a user gives a Job: as [`parse`], and a key under a
/// [`RESERVED_PREFIXES`] entry is refused.
pub fn parse_assigned(arg: &str) -> Result<(String, String), LabelError> {
    let (key, value) = parse(arg)?;
    if let Some(prefix) = RESERVED_PREFIXES.iter().find(|p| key.to_ascii_lowercase().starts_with(*p)) {
        return Err(LabelError::Reserved(key, prefix));
    }
    Ok((key, value))
}

/// Parses `KEY=VALUE` (the value may be empty, and may contain `=`): a
/// label, or a selector matching one.
pub fn parse(arg: &str) -> Result<(String, String), LabelError> {
    let (key, value) = arg.split_once('=').ok_or_else(|| LabelError::NotKeyValue(arg.to_owned()))?;
    check(key, value)?;
    Ok((key.to_owned(), value.to_owned()))
}

/// Checks one label.
pub fn check(key: &str, value: &str) -> Result<(), LabelError> {
    let (prefix, name) = key.rsplit_once('/').map_or((None, key), |(p, n)| (Some(p), n));
    let edge_ok = |s: &str| {
        s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
            && s.chars().last().is_some_and(|c| c.is_ascii_alphanumeric())
    };
    let name_ok = name.len() <= MAX_NAME
        && edge_ok(name)
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    let prefix_ok = prefix.is_none_or(|p| {
        p.len() <= MAX_PREFIX
            && p.split('.').all(|part| {
                edge_ok(part)
                    && part.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            })
    });
    if !(name_ok && prefix_ok) {
        return Err(LabelError::Key(key.to_owned()));
    }
    if value.len() > MAX_VALUE || value.chars().any(crate::text::is_unsafe) {
        return Err(LabelError::Value(key.to_owned()));
    }
    Ok(())
}

/// Checks a whole set.
pub fn check_all(labels: &Labels) -> Result<(), LabelError> {
    if labels.len() > MAX_LABELS {
        return Err(LabelError::TooMany);
    }
    labels.iter().try_for_each(|(k, v)| check(k, v))
}

/// Whether `labels` has every `key=value` of `selector`.
pub fn matches(labels: &Labels, selector: &[(String, String)]) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_values_are_checked() {
        assert_eq!(parse("team=infra"), Ok(("team".into(), "infra".into())));
        assert_eq!(parse("example.com/team=a=b"), Ok(("example.com/team".into(), "a=b".into())));
        // The keys the frontends set are theirs alone (`pvisor serve` stops a
        // live Job labelled with a sandbox it has no record of).
        for reserved in
            ["pvisor.serve/sandbox=x", "containerd.io/container=x", "io.kubernetes.cri.sandbox-id=x"]
        {
            assert!(matches!(parse_assigned(reserved), Err(LabelError::Reserved(..))), "{reserved}");
            assert!(parse(reserved).is_ok(), "a selector may name one: {reserved}");
        }
        assert_eq!(parse_assigned("team=infra"), Ok(("team".into(), "infra".into())));
        assert_eq!(parse("empty="), Ok(("empty".into(), String::new())));
        assert!(matches!(parse("novalue"), Err(LabelError::NotKeyValue(_))));
        for bad in ["=x", "-a=x", "a-=x", "a b=x", "Big.Prefix/a=x", "/a=x", "a/=x", "x.y..z/a=x"] {
            assert!(matches!(parse(bad), Err(LabelError::Key(_))), "{bad}");
        }
        assert!(matches!(parse(&format!("k={}", "v".repeat(1025))), Err(LabelError::Value(_))));
        for bad in ["k=\u{1b}[2J", "k=a\nb", "k=\u{202e}txt"] {
            assert!(matches!(parse(bad), Err(LabelError::Value(_))), "{bad:?}");
        }
        let many: Labels = (0..=MAX_LABELS).map(|i| (format!("k{i}"), String::new())).collect();
        assert_eq!(check_all(&many), Err(LabelError::TooMany));
    }

    #[test]
    fn a_selector_needs_every_pair() {
        let labels: Labels = [("a".into(), "1".into()), ("b".into(), "2".into())].into();
        assert!(matches(&labels, &[]));
        assert!(matches(&labels, &[("a".into(), "1".into())]));
        assert!(!matches(&labels, &[("a".into(), "1".into()), ("b".into(), "3".into())]));
        assert!(!matches(&labels, &[("c".into(), String::new())]));
    }
}
