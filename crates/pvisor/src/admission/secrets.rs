//! Secrets: which variables are scrubbed by name and which host secret
//! stores are hidden from the command.
//!
//! Everything here is decided from the request alone, before any record
//! exists; the decisions are recorded by name only (never a value) as
//! `admission.rewrite` events by [`super::policy`].

use std::path::{Path, PathBuf};

use super::{AdmissionError, SecretPolicy};

/// What the secrets step decided besides the variables that pass: what
/// was scrubbed and the paths the command must not see.
pub(super) struct Secrets {
    /// The names of the variables scrubbed as secrets.
    pub(super) scrubbed: Vec<String>,
    /// Each existing secret path to hide (canonical), with why.
    pub(super) hidden: Vec<(PathBuf, &'static str)>,
    /// Paths asked to be hidden that hold the workspace, so stay visible.
    pub(super) skipped: Vec<PathBuf>,
}

/// Decides which variables are scrubbed by name and which secret stores
/// (the defaults under the home, `--hide` paths, other pvisor state
/// directories) are hidden, honouring `--env` and `--expose`. A path that
/// holds the workspace is never hidden; a non-UTF-8 one refuses the request.
/// Returns the variables that pass (before pvisor sets its own).
pub(super) fn resolve(
    env: Vec<(String, String)>,
    secrets: &SecretPolicy,
    workspace: &Path,
) -> Result<(Vec<(String, String)>, Secrets), AdmissionError> {
    type Vars = Vec<(String, String)>;
    let (env, scrubbed): (Vars, Vars) =
        env.into_iter().partition(|(k, _)| !is_secret_name(k) || secrets.pass_env.iter().any(|p| p == k));
    let scrubbed: Vec<String> = scrubbed.into_iter().map(|(k, _)| k).collect();
    let mut hidden_secrets: Vec<(PathBuf, &'static str)> = Vec::new();
    let mut skipped_hides: Vec<PathBuf> = Vec::new();
    // Most candidates (47 default secret stores, other state directories)
    // do not exist: one lstat says so, where realpath would walk each
    // component first.
    let canonical = |p: &Path| std::fs::symlink_metadata(p).ok().and_then(|_| std::fs::canonicalize(p).ok());
    let exposed: Vec<PathBuf> =
        secrets.expose.iter().map(|p| canonical(p).unwrap_or_else(|| p.clone())).collect();
    let defaults = secrets.home.iter().flat_map(|home| DEFAULT_HIDDEN.iter().map(move |rel| home.join(rel)));
    let candidates = defaults
        .map(|p| (p, "secret store"))
        .chain(secrets.hide.iter().map(|p| (p.clone(), "--hide")))
        .chain(secrets.other_state_dirs.iter().map(|p| (p.clone(), "another pvisor state directory")));
    for (path, reason) in candidates {
        let Some(real) = canonical(&path) else { continue };
        let state_dir = reason == "another pvisor state directory";
        // `--expose DIR` shows the secrets beneath DIR too (`--expose ~/.claude`);
        // no exposure reaches into a pvisor state directory.
        if (!state_dir && exposed.iter().any(|e| real.starts_with(e)))
            || hidden_secrets.iter().any(|(p, _)| *p == real)
        {
            continue;
        }
        // The workspace itself can never be hidden from the command; say so
        // rather than drop the request silently.
        if workspace.starts_with(&real) {
            skipped_hides.push(real);
            continue;
        }
        if real.to_str().is_none() {
            return Err(AdmissionError::NonUtf8Path { path: real });
        }
        hidden_secrets.push((real, reason));
    }
    Ok((env, Secrets { scrubbed, hidden: hidden_secrets, skipped: skipped_hides }))
}

/// Secret stores hidden by default, relative to the home directory: cloud,
/// package-registry and database credentials, the credentials of the AI
/// agents people run under pvisor, and shell histories (they hold pasted
/// tokens). `--expose PATH` shows one (or everything beneath PATH) anyway.
pub const DEFAULT_HIDDEN: [&str; 47] = [
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".config/gcloud",
    ".config/gh",
    ".config/hub",
    ".netrc",
    ".git-credentials",
    ".docker",
    ".kube",
    ".npmrc",
    ".pypirc",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".password-store",
    ".local/share/keyrings",
    ".vault-token",
    ".terraform.d/credentials.tfrc.json",
    ".config/git/credentials",
    ".pgpass",
    ".my.cnf",
    ".m2/settings.xml",
    ".yarnrc.yml",
    ".gem/credentials",
    ".cache/huggingface/token",
    ".huggingface/token",
    ".config/rclone",
    ".config/op",
    ".env",
    // AI agents: Claude Code, Codex, Gemini CLI, Copilot, Cursor, Aider, goose.
    ".claude/.credentials.json",
    ".claude.json",
    ".codex/auth.json",
    ".gemini/oauth_creds.json",
    ".gemini/.env",
    ".config/github-copilot",
    ".cursor/mcp.json",
    ".config/Cursor/User/globalStorage",
    ".aider.conf.yml",
    ".config/goose",
    // Shell and REPL histories.
    ".bash_history",
    ".zsh_history",
    ".python_history",
    ".psql_history",
    ".mysql_history",
    ".node_repl_history",
    ".local/share/fish/fish_history",
];

/// Whether a variable's name marks it as a secret (scrubbed unless passed).
/// Settings that only look like secrets (`AWS_REGION`, `*_CA_BUNDLE`,
/// `*_CERT_FILE`) pass: scrubbing them breaks tools and protects nothing.
pub fn is_secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    let harmless = ["AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_CONFIG_FILE"]
        .contains(&upper.as_str())
        || ["_CA_BUNDLE", "_CERT_FILE", "_CERT_DIR"].iter().any(|s| upper.ends_with(s));
    if harmless {
        return false;
    }
    ["SSH_AUTH_SOCK", "PGPASSWORD", "MYSQL_PWD", "DATABASE_URL", "API_KEY"].contains(&upper.as_str())
        || upper.starts_with("AWS_")
        || upper.starts_with("OP_SESSION_")
        || upper.contains("_AUTHTOKEN")
        || ["_TOKEN", "_SECRET", "_PASSWORD", "_PASSWD", "_KEY", "_DATABASE_URL"]
            .iter()
            .any(|s| upper.ends_with(s))
}

#[cfg(test)]
mod tests {
    use super::is_secret_name;

    #[test]
    fn secret_names_are_scrubbed_and_lookalike_settings_pass() {
        for secret in [
            "GH_TOKEN",
            "DB_PASSWORD",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "SSH_AUTH_SOCK",
            "PGPASSWORD",
            "MYSQL_PWD",
            "DATABASE_URL",
            "REPLICA_DATABASE_URL",
            "OPENAI_API_KEY",
            "ANTHROPIC_API_KEY",
            "API_KEY",
            "STRIPE_KEY",
            "OP_SESSION_my",
            "npm_config__authToken",
            "NPM_CONFIG_//registry.npmjs.org/:_authToken",
        ] {
            assert!(is_secret_name(secret), "{secret} should be scrubbed");
        }
        for harmless in [
            "AWS_REGION",
            "AWS_DEFAULT_REGION",
            "AWS_PROFILE",
            "AWS_CA_BUNDLE",
            "REQUESTS_CA_BUNDLE",
            "SSL_CERT_FILE",
            "PATH",
            "HOME",
            "KEYMAP",
        ] {
            assert!(!is_secret_name(harmless), "{harmless} should pass");
        }
    }
}
