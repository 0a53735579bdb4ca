//! Agent presets: what `pvisor run --agent NAME` grants a coding agent.
//!
//! A preset is data (`agents/NAME.toml` in this crate, compiled in), which
//! the user extends in their own config under `[agents.NAME]` (never from a
//! workspace's `.pvisor.toml`: a repository must not widen what an agent
//! gets). A preset names the agent's home state (a writable copy-on-write
//! layer kept with the Job, see `--state`), the paths in it that make a
//! later run execute something (`gated`), the API hosts it needs, the
//! credentials the proxy brokers (`VAR@HOST[:PORT]`, see `--secret`), the
//! variables that point it at another API (`base_url`: its host is allowed
//! and gets the same credentials), variables it passes and sets.
//!
//! This module only turns a preset and the caller's environment into a
//! [`Grant`]: plain lists of the same things the flags take, so a preset can
//! never grant what flags could not, and the run records them the same way.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The presets shipped with pvisor: name and TOML.
const BUILTIN: &[(&str, &str)] = &[
    ("claude", include_str!("../agents/claude.toml")),
    ("codex", include_str!("../agents/codex.toml")),
    ("gemini", include_str!("../agents/gemini.toml")),
    ("opencode", include_str!("../agents/opencode.toml")),
    ("aider", include_str!("../agents/aider.toml")),
];

/// One preset, as in `agents/NAME.toml` or a user's `[agents.NAME]` table.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentPreset {
    /// What the agent is, for `--help`-like listings.
    #[serde(default)]
    pub description: Option<String>,
    /// Home state paths, each starting `~/`: directories or single files.
    #[serde(default)]
    pub state: Vec<String>,
    /// Globs (relative to each state path) of state that makes a later run
    /// execute something: carried forward only once approved.
    #[serde(default)]
    pub gated: Vec<String>,
    /// Network destinations, in `--allow`'s form.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Credentials to broker, in `--secret`'s form `VAR@HOST[:PORT]`.
    #[serde(default)]
    pub secrets: Vec<String>,
    /// Variables holding the API's base URL: when one is set, its host is
    /// allowed and every secret is brokered to it too.
    #[serde(default)]
    pub base_url: Vec<String>,
    /// Variables passed even if they look secret (`--env`).
    #[serde(default)]
    pub pass: Vec<String>,
    /// Variables set in the sandbox.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// Why a preset cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AgentError {
    #[error("no agent preset named {name:?}; the presets are {known} (add your own as [agents.{name}] in {config})")]
    Unknown { name: String, known: String, config: String },
    #[error("agent preset {name}: {what}")]
    Invalid { name: String, what: String },
}

/// What a preset grants one run, in the flags' own terms.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Grant {
    pub name: String,
    pub state: Vec<PathBuf>,
    pub gated: Vec<String>,
    pub allow: Vec<String>,
    /// `VAR@HOST:PORT`, only for variables that are set.
    pub secrets: Vec<String>,
    /// Credential variables the preset names that are not set.
    pub unset: Vec<String>,
    pub pass: Vec<String>,
    pub env: Vec<(String, String)>,
    /// What was left out, and why (said in the grant's line).
    pub notes: Vec<String>,
}

/// The names of every preset: the built-in ones and the user's.
pub fn names(user: &BTreeMap<String, AgentPreset>) -> Vec<String> {
    let mut names: Vec<String> = BUILTIN.iter().map(|(n, _)| n.to_string()).collect();
    names.extend(user.keys().filter(|k| !names.contains(k)).cloned().collect::<Vec<_>>());
    names
}

/// The preset `name`: the built-in one extended by the user's table of the
/// same name (lists appended, variables overridden), or the user's own.
pub fn preset(
    name: &str,
    user: &BTreeMap<String, AgentPreset>,
    config: &Path,
) -> Result<AgentPreset, AgentError> {
    let builtin = BUILTIN
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, text)| toml::from_str::<AgentPreset>(text).expect("the built-in presets parse (tested)"));
    match (builtin, user.get(name)) {
        (Some(mut base), Some(extra)) => {
            extend(&mut base, extra.clone());
            Ok(base)
        }
        (Some(base), None) => Ok(base),
        (None, Some(own)) => Ok(own.clone()),
        (None, None) => Err(AgentError::Unknown {
            name: name.to_owned(),
            known: names(user).join(", "),
            config: config.display().to_string(),
        }),
    }
}

fn extend(base: &mut AgentPreset, extra: AgentPreset) {
    base.description = extra.description.or(base.description.take());
    base.state.extend(extra.state);
    base.gated.extend(extra.gated);
    base.allow.extend(extra.allow);
    base.secrets.extend(extra.secrets);
    base.base_url.extend(extra.base_url);
    base.pass.extend(extra.pass);
    base.env.extend(extra.env);
}

/// What `preset` grants a run whose environment is `var` and home `home`.
pub fn grant(
    name: &str,
    preset: &AgentPreset,
    var: &dyn Fn(&str) -> Option<String>,
    home: &Path,
) -> Result<Grant, AgentError> {
    let invalid = |what: String| AgentError::Invalid { name: name.to_owned(), what };
    let state = preset
        .state
        .iter()
        .map(|p| match p.strip_prefix("~/") {
            Some(rest) if !rest.is_empty() && !rest.split('/').any(|c| c == ".." || c.is_empty()) => {
                Ok(home.join(rest))
            }
            _ => Err(invalid(format!(
                "state path {p:?} must be a path under the home directory, written ~/PATH"
            ))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut allow = preset.allow.clone();
    let mut targets: Vec<String> = Vec::new();
    for url_var in &preset.base_url {
        let Some(url) = var(url_var).filter(|v| !v.is_empty()) else { continue };
        let target = base_url_target(&url).map_err(|why| invalid(format!("{url_var}={url:?}: {why}")))?;
        allow.push(target.clone());
        targets.push(target);
    }
    let (mut secrets, mut unset) = (Vec::new(), Vec::new());
    for binding in &preset.secrets {
        let (variable, _) = binding
            .split_once('@')
            .ok_or_else(|| invalid(format!("secret {binding:?} must be VAR@HOST[:PORT]")))?;
        if var(variable).is_none_or(|v| v.is_empty()) {
            if !unset.iter().any(|u| u == variable) {
                unset.push(variable.to_owned());
            }
            continue;
        }
        secrets.push(binding.clone());
        secrets.extend(targets.iter().map(|t| format!("{variable}@{t}")));
    }
    secrets.dedup();
    allow.dedup();
    Ok(Grant {
        name: name.to_owned(),
        state,
        gated: preset.gated.clone(),
        allow,
        secrets,
        unset,
        pass: preset.pass.clone(),
        env: preset.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        notes: Vec::new(),
    })
}

impl Grant {
    /// The grant for a vm run: the agent's home is the VM's own (thrown
    /// away with it), so no state paths; and a key is brokered only to a
    /// loopback port over plain HTTP (the guest cannot be given the run's
    /// CA), so the bindings to HTTPS APIs are left out. Each says so.
    pub fn for_vm(&mut self) {
        if !self.state.is_empty() {
            self.state.clear();
            self.notes.push("vm: the agent's home is the VM's own, thrown away with it".into());
        }
        let before = self.secrets.len();
        self.secrets.retain(|b| {
            let target = b.split_once('@').map_or("", |(_, t)| t);
            let (host, port) = target.rsplit_once(':').unwrap_or((target, ""));
            !port.is_empty()
                && pvisor_net::broker::is_loopback(host.trim_start_matches('[').trim_end_matches(']'))
        });
        if self.secrets.len() < before {
            self.notes.push(
                "vm: keys are brokered only to a loopback model server (its base URL); use --executor ns for HTTPS APIs"
                    .into(),
            );
        }
    }
}

/// `HOST:PORT` of a base URL (`http://127.0.0.1:8000/v1` → `127.0.0.1:8000`),
/// the port defaulting to the scheme's.
fn base_url_target(url: &str) -> Result<String, String> {
    let uri: http::Uri = url.parse().map_err(|e| format!("not a URL ({e})"))?;
    let default_port = match uri.scheme_str() {
        Some("https") => 443,
        Some("http") => 80,
        _ => return Err("a base URL starts with http:// or https://".into()),
    };
    let host = uri.host().filter(|h| !h.is_empty()).ok_or("the URL names no host")?;
    Ok(format!("{host}:{}", uri.port_u16().unwrap_or(default_port)))
}

impl Grant {
    /// The one line that says what the preset granted.
    pub fn summary(&self) -> String {
        let list = |items: &[String]| if items.is_empty() { "nothing".to_owned() } else { items.join(", ") };
        let state: Vec<String> = self.state.iter().map(|p| p.display().to_string()).collect();
        let mut keys: Vec<String> = Vec::new();
        for binding in &self.secrets {
            let (var, host) = binding.split_once('@').unwrap_or((binding, ""));
            match keys.iter_mut().find(|k| k.starts_with(&format!("{var} → "))) {
                Some(k) => k.push_str(&format!(", {host}")),
                None => keys.push(format!("{var} → {host}")),
            }
        }
        let state = match state.is_empty() {
            true => String::new(),
            false => format!(" state {} (copy-on-write, kept with the Job);", state.join(", ")),
        };
        let mut line = format!(
            "agent {}:{state} network {}; keys {}",
            self.name,
            list(&self.allow),
            if keys.is_empty() {
                "none".to_owned()
            } else {
                format!("{} (brokered: never inside)", keys.join("; "))
            },
        );
        if !self.env.is_empty() {
            let set: Vec<String> = self.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
            line.push_str(&format!("; sets {}", set.join(" ")));
        }
        if keys.is_empty() && !self.unset.is_empty() {
            line.push_str(&format!(" ({} unset: the agent must use its own login)", self.unset.join(", ")));
        }
        for note in &self.notes {
            line.push_str(&format!("; {note}"));
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
    }

    #[test]
    fn every_builtin_preset_parses_and_grants_under_home() {
        for (name, _) in BUILTIN {
            let preset = preset(name, &BTreeMap::new(), Path::new("/c")).unwrap();
            let grant = grant(name, &preset, &env(&[]), Path::new("/home/u")).unwrap();
            assert!(!grant.state.is_empty(), "{name}");
            assert!(grant.state.iter().all(|p| p.starts_with("/home/u/")), "{name}");
            assert!(grant.secrets.is_empty(), "{name}: no variable is set");
        }
    }

    #[test]
    fn a_base_url_is_allowed_and_gets_the_secrets() {
        let preset = preset("claude", &BTreeMap::new(), Path::new("/c")).unwrap();
        let vars = [("ANTHROPIC_API_KEY", "k"), ("ANTHROPIC_BASE_URL", "http://127.0.0.1:8000/v1")];
        let grant = grant("claude", &preset, &env(&vars), Path::new("/h")).unwrap();
        assert!(grant.allow.contains(&"127.0.0.1:8000".to_owned()));
        assert!(grant.secrets.contains(&"ANTHROPIC_API_KEY@127.0.0.1:8000".to_owned()));
        assert!(grant.secrets.contains(&"ANTHROPIC_API_KEY@api.anthropic.com:443".to_owned()));
        assert_eq!(grant.unset, ["ANTHROPIC_AUTH_TOKEN"]);
        assert!(grant.summary().contains("ANTHROPIC_API_KEY → api.anthropic.com:443, 127.0.0.1:8000"));
        let mut vm = grant.clone();
        vm.for_vm();
        assert_eq!(vm.secrets, ["ANTHROPIC_API_KEY@127.0.0.1:8000"], "on a vm, only the loopback server's");
        assert!(vm.state.is_empty() && vm.summary().contains("vm: the agent's home is the VM's own"));
        let bad = grant_err("claude", &[("ANTHROPIC_BASE_URL", "ftp://x")]);
        assert!(bad.contains("ANTHROPIC_BASE_URL"), "{bad}");
    }

    fn grant_err(name: &str, vars: &[(&str, &str)]) -> String {
        let preset = preset(name, &BTreeMap::new(), Path::new("/c")).unwrap();
        grant(name, &preset, &env(vars), Path::new("/h")).unwrap_err().to_string()
    }

    #[test]
    fn the_user_extends_a_preset_or_adds_one_and_an_unknown_name_lists_them() {
        let mut user = BTreeMap::new();
        user.insert(
            "claude".into(),
            AgentPreset { allow: vec!["proxy.corp:443".into()], ..Default::default() },
        );
        user.insert("mine".into(), AgentPreset { state: vec!["~/.mine".into()], ..Default::default() });
        let claude = preset("claude", &user, Path::new("/c")).unwrap();
        assert!(
            claude.allow.contains(&"api.anthropic.com:443".into())
                && claude.allow.contains(&"proxy.corp:443".into())
        );
        assert_eq!(preset("mine", &user, Path::new("/c")).unwrap().state, ["~/.mine"]);
        let unknown = preset("cladue", &user, Path::new("/cfg.toml")).unwrap_err().to_string();
        assert!(unknown.contains("claude, codex, gemini, opencode, aider, mine"), "{unknown}");
        assert!(unknown.contains("[agents.cladue] in /cfg.toml"), "{unknown}");
    }

    #[test]
    fn a_state_path_must_stay_under_home() {
        for bad in ["/etc/x", "~/../x", "~/", "x", "~/a//b"] {
            let preset = AgentPreset { state: vec![bad.into()], ..Default::default() };
            let err = grant("p", &preset, &env(&[]), Path::new("/h")).unwrap_err().to_string();
            assert!(err.contains("under the home directory"), "{bad}: {err}");
        }
    }
}
