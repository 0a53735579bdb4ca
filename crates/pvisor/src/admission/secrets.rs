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

/// Decides which variables are scrubbed (by name or by the shape of their
/// value) and which secret stores
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
    let (env, scrubbed): (Vars, Vars) = env.into_iter().partition(|(k, v)| {
        !(is_secret_name(k) || is_secret_value(v)) || secrets.pass_env.iter().any(|p| p == k)
    });
    let scrubbed: Vec<String> = scrubbed.into_iter().map(|(k, _)| k).collect();
    let mut hidden_secrets: Vec<(PathBuf, &'static str)> = Vec::new();
    let mut skipped_hides: Vec<PathBuf> = Vec::new();
    // Most candidates (the default secret stores, other state directories)
    // do not exist: one lstat says so, where realpath would walk each
    // component first.
    let canonical = |p: &Path| std::fs::symlink_metadata(p).ok().and_then(|_| std::fs::canonicalize(p).ok());
    let exposed: Vec<PathBuf> =
        secrets.expose.iter().map(|p| canonical(p).unwrap_or_else(|| p.clone())).collect();
    let defaults = secrets.home.iter().flat_map(|home| DEFAULT_HIDDEN.iter().map(move |rel| home.join(rel)));
    let by_prefix = secrets.home.iter().flat_map(|home| named_by_prefix(home));
    let candidates = defaults
        .chain(by_prefix)
        .map(|p| (p, "secret store"))
        .chain(secrets.hide.iter().map(|p| (p.clone(), "--hide")))
        .chain(secrets.other_state_dirs.iter().map(|p| (p.clone(), OTHER_STATE_DIR)));
    for (path, reason) in candidates {
        let Some(real) = canonical(&path) else { continue };
        let state_dir = reason == OTHER_STATE_DIR;
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

/// The entries at the top of `home` whose names start with one of
/// [`HIDDEN_NAME_PREFIXES`] (one directory listing; none if unreadable).
fn named_by_prefix(home: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(home) else { return Vec::new() };
    entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            let name = e.file_name();
            let name = name.as_encoded_bytes();
            HIDDEN_NAME_PREFIXES.iter().any(|prefix| name.starts_with(prefix.as_bytes()))
        })
        .map(|e| e.path())
        .collect()
}

/// Secret stores at the top of the home known by the start of their
/// names: copies of an agent's credentials under changing names (Claude
/// Code's `.claude.json.backup`, `.claude.json.backup.<time>` and
/// `.claude.json.corrupted.<time>`, and the `.claude.json.bak` users keep).
/// Only those present at admission are hidden: one made later is the
/// sandbox's own (it cannot read the host's copy to make it).
pub const HIDDEN_NAME_PREFIXES: &[&str] =
    &[".claude.json.backup", ".claude.json.corrupted", ".claude.json.bak"];

/// Why another pvisor state directory is hidden (and how admission tells
/// it from a secret store).
pub(super) const OTHER_STATE_DIR: &str = "another pvisor state directory";

/// Secret stores hidden by default, relative to the home directory: cloud,
/// package-registry and database credentials, the credentials of the AI
/// agents people run under pvisor, browser cookie and login stores, and
/// shell and REPL histories (they hold pasted tokens). `--expose PATH` shows
/// one (or everything beneath PATH) anyway. docs/threat-model.md lists them.
pub const DEFAULT_HIDDEN: &[&str] = &[
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".config/gcloud",
    ".config/gh",
    ".config/hub",
    ".config/glab-cli",
    ".netrc",
    ".git-credentials",
    ".config/git/credentials",
    // Git's configuration can carry credentials in remote URLs
    // (`url.https://user:token@host/.insteadOf`) and credential helpers.
    ".gitconfig",
    ".config/git/config",
    ".docker",
    ".config/containers/auth.json",
    ".kube",
    ".npmrc",
    ".pypirc",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".gem/credentials",
    ".m2/settings.xml",
    ".gradle/gradle.properties",
    ".ivy2/.credentials",
    ".sbt/credentials",
    ".sbt/.credentials",
    ".nuget/NuGet/NuGet.Config",
    ".composer/auth.json",
    ".config/composer/auth.json",
    ".yarnrc.yml",
    ".password-store",
    ".local/share/keyrings",
    ".pki/nssdb",
    ".vault-token",
    ".terraform.d/credentials.tfrc.json",
    ".terraformrc",
    ".pulumi/credentials.json",
    ".config/sops/age/keys.txt",
    ".config/age",
    ".s3cfg",
    ".boto",
    ".databrickscfg",
    ".oci",
    ".config/doctl",
    ".config/hcloud",
    ".fly",
    ".config/netlify",
    ".netlify",
    ".local/share/com.vercel.cli",
    ".config/stripe",
    ".config/ngrok",
    ".ngrok2",
    ".kaggle/kaggle.json",
    ".pgpass",
    ".my.cnf",
    ".cache/huggingface/token",
    ".huggingface/token",
    ".config/rclone",
    ".config/op",
    ".env",
    // AI agents: Claude Code, Codex, Gemini CLI, Copilot, Cursor, Aider,
    // goose, opencode, llm, Continue, Codeium/Windsurf.
    ".claude/.credentials.json",
    ".claude.json",
    // Its copies of `.claude.json` (account data, a key set with `/login`).
    ".claude/backups",
    ".codex/auth.json",
    ".gemini/oauth_creds.json",
    ".gemini/.env",
    ".config/github-copilot",
    ".cursor/mcp.json",
    ".config/Cursor/User/globalStorage",
    ".aider.conf.yml",
    ".config/goose",
    ".local/share/opencode/auth.json",
    ".config/io.datasette.llm/keys.json",
    ".continue/config.json",
    ".continue/config.yaml",
    ".codeium",
    // Browsers and mail: cookies, saved logins and their key databases.
    ".mozilla",
    "snap/firefox/common/.mozilla",
    ".thunderbird",
    ".config/google-chrome",
    ".config/chromium",
    ".config/BraveSoftware",
    ".config/microsoft-edge",
    ".config/vivaldi",
    ".config/opera",
    "snap/chromium/common/chromium",
    ".var/app/org.mozilla.firefox",
    ".var/app/com.google.Chrome",
    ".var/app/org.chromium.Chromium",
    ".var/app/com.brave.Browser",
    // Shell and REPL histories.
    ".bash_history",
    ".zsh_history",
    ".zhistory",
    ".histfile",
    ".sh_history",
    ".local/share/fish/fish_history",
    ".config/fish/fish_history",
    ".local/share/atuin",
    ".python_history",
    ".ipython/profile_default/history.sqlite",
    ".node_repl_history",
    ".psql_history",
    ".mysql_history",
    ".sqlite_history",
    ".rediscli_history",
    ".dbshell",
    ".irb_history",
    ".Rhistory",
    ".julia/logs/repl_history.jl",
    ".lesshst",
    ".viminfo",
];

/// Whether a variable's name marks it as a secret (scrubbed unless passed).
///
/// The name is read as `_`-separated words: a word such as `TOKEN`,
/// `SECRET`, `PASSWORD`, `PASS`, `AUTH` or `CREDENTIALS` anywhere marks it
/// (`TOKEN` alone, `GITHUB_TOKEN_RW`), as does a last word `KEY`/`PWD` or a
/// `*_CONNECTION_STRING` ending. Settings that only look like secrets
/// (`AWS_REGION`, `*_CA_BUNDLE`, `*_CERT_FILE`, `PWD`, `GIT_AUTHOR_NAME`)
/// pass: scrubbing them breaks tools and protects nothing.
pub fn is_secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    let harmless = ["AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_CONFIG_FILE", "PWD", "OLDPWD"]
        .contains(&upper.as_str())
        || ["_CA_BUNDLE", "_CERT_FILE", "_CERT_DIR"].iter().any(|s| upper.ends_with(s));
    if harmless {
        return false;
    }
    let words: Vec<&str> =
        upper.split(|c: char| !c.is_ascii_alphanumeric()).filter(|w| !w.is_empty()).collect();
    let last = words.last().copied().unwrap_or("");
    ["SSH_AUTH_SOCK", "DATABASE_URL", "BW_SESSION", "GOOGLE_CREDENTIALS"].contains(&upper.as_str())
        || upper.starts_with("AWS_")
        || upper.starts_with("OP_SESSION_")
        || upper.contains("AUTHTOKEN")
        || upper.ends_with("_DATABASE_URL")
        || upper.ends_with("CONNECTION_STRING")
        || ["KEY", "PWD", "APIKEY"].contains(&last)
        || words.iter().any(|w| SECRET_WORDS.contains(w))
        || ["PGPASSWORD", "MYSQL_PWD"].contains(&upper.as_str())
}

/// Words that mark a variable's name as a secret wherever they stand.
const SECRET_WORDS: [&str; 14] = [
    "TOKEN",
    "TOKENS",
    "SECRET",
    "SECRETS",
    "PASSWORD",
    "PASSWD",
    "PASS",
    "PASSPHRASE",
    "AUTH",
    "CREDENTIAL",
    "CREDENTIALS",
    "CREDS",
    "APIKEY",
    "PRIVATEKEY",
];

/// Whether a variable's value has the shape of a credential, whatever the
/// variable is called (`MY_SETTINGS=https://u:p@host`): a URL with a
/// password in it, a connection string's key or password field, a PEM
/// private key, or a token with a well-known issuer prefix (GitHub, GitLab,
/// Slack, OpenAI, Anthropic, AWS access key ids, Google API keys, JWTs).
///
/// Every run checks every variable, and compiling the patterns costs about
/// 0.7 ms, a twentieth of a whole run of `true`. Most values (paths,
/// locales, terminal names) hold none of the patterns' literal parts, so
/// they are passed without compiling anything.
pub fn is_secret_value(value: &str) -> bool {
    could_be_secret_value(value) && secret_value_patterns().is_match(value)
}

/// A credential's shape: its pattern, the literals of which every match
/// holds at least one, and one that every match holds besides (compared
/// ASCII case-insensitively).
struct ValueShape {
    pattern: &'static str,
    holds_one_of: &'static [&'static str],
    and_holds: &'static str,
}

const VALUE_SHAPES: [ValueShape; 12] = [
    // scheme://user:password@host (userinfo with a password). Many values
    // are URLs (proxies, registries); few of them hold an `@`.
    ValueShape {
        pattern: r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s@:]*:[^/\s@]+@",
        holds_one_of: &["://"],
        and_holds: "@",
    },
    // Azure/ADO.NET-style connection strings.
    ValueShape {
        pattern: r"(?i)(^|;)\s*(AccountKey|SharedAccessSignature|SharedAccessKey|Password|Pwd)\s*=",
        holds_one_of: &["AccountKey", "SharedAccess", "Password", "Pwd"],
        and_holds: "",
    },
    ValueShape {
        pattern: r"-----BEGIN[A-Z ]*PRIVATE KEY-----",
        holds_one_of: &["-----BEGIN"],
        and_holds: "",
    },
    ValueShape {
        pattern: r"(^|[^A-Za-z0-9_])(ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}",
        holds_one_of: &["ghp_", "gho_", "ghu_", "ghs_", "ghr_"],
        and_holds: "",
    },
    ValueShape {
        pattern: r"(^|[^A-Za-z0-9_])github_pat_[A-Za-z0-9_]{20,}",
        holds_one_of: &["github_pat_"],
        and_holds: "",
    },
    ValueShape {
        pattern: r"(^|[^A-Za-z0-9_])(glpat|glrt|gldt)-[A-Za-z0-9_-]{16,}",
        holds_one_of: &["glpat-", "glrt-", "gldt-"],
        and_holds: "",
    },
    ValueShape {
        pattern: r"(^|[^A-Za-z0-9_])xox[abposer]-[A-Za-z0-9-]{10,}",
        holds_one_of: &["xox"],
        and_holds: "",
    },
    ValueShape {
        pattern: r"(^|[^A-Za-z0-9_])sk-(ant-|proj-)?[A-Za-z0-9_-]{20,}",
        holds_one_of: &["sk-"],
        and_holds: "",
    },
    ValueShape {
        pattern: r"(^|[^A-Za-z0-9])(AKIA|ASIA)[A-Z0-9]{16}([^A-Za-z0-9]|$)",
        holds_one_of: &["AKIA", "ASIA"],
        and_holds: "",
    },
    ValueShape { pattern: r"(^|[^A-Za-z0-9_])AIza[A-Za-z0-9_-]{35}", holds_one_of: &["AIza"], and_holds: "" },
    ValueShape {
        pattern: r"(^|[^A-Za-z0-9_])(npm_[A-Za-z0-9]{36}|pypi-AgE[A-Za-z0-9_-]{20,}|hf_[A-Za-z0-9]{30,})",
        holds_one_of: &["npm_", "pypi-AgE", "hf_"],
        and_holds: "",
    },
    ValueShape {
        pattern: r"(^|[^A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.",
        holds_one_of: &["eyJ"],
        and_holds: "",
    },
];

/// Whether `value` holds a literal of some shape: without one, no pattern
/// can match, and none need be compiled. The case-insensitive pattern
/// folds as Unicode does, where the long s and the Kelvin sign are an s
/// and a k: they are folded here too.
fn could_be_secret_value(value: &str) -> bool {
    let folded: String = value
        .chars()
        .map(|c| match c {
            '\u{17f}' => 's',
            '\u{212a}' => 'k',
            c => c.to_ascii_lowercase(),
        })
        .collect();
    let holds = |literal: &str| folded.contains(&literal.to_ascii_lowercase());
    VALUE_SHAPES
        .iter()
        .any(|shape| holds(shape.and_holds) && shape.holds_one_of.iter().any(|literal| holds(literal)))
}

fn secret_value_patterns() -> &'static regex::RegexSet {
    static PATTERNS: std::sync::OnceLock<regex::RegexSet> = std::sync::OnceLock::new();
    PATTERNS.get_or_init(|| {
        regex::RegexSet::new(VALUE_SHAPES.iter().map(|shape| shape.pattern))
            .expect("the secret value patterns compile")
    })
}

#[cfg(test)]
mod tests {
    use super::{
        could_be_secret_value, is_secret_name, is_secret_value, secret_value_patterns, VALUE_SHAPES,
    };

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
            "PASSWORD",
            "TOKEN",
            "SECRET",
            "SMTP_PASS",
            "FTP_PWD",
            "BW_SESSION",
            "GOOGLE_CREDENTIALS",
            "GOOGLE_APPLICATION_CREDENTIALS",
            "AZURE_STORAGE_CONNECTION_STRING",
            "REGISTRY_AUTH",
            "GITHUB_TOKEN_RW",
            "SIGNING_PASSPHRASE",
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
            "PWD",
            "OLDPWD",
            "GIT_AUTHOR_NAME",
            "XAUTHORITY",
            "PASSTHROUGH_MODE",
            "LANG",
        ] {
            assert!(!is_secret_name(harmless), "{harmless} should pass");
        }
    }

    /// Values of each credential shape, which must be scrubbed.
    const SECRET_VALUES: [&str; 34] = [
        "https://alice:s3cret@git.example.com/repo.git",
        "postgres://u:v3@h/db",
        "a https_proxy of http://:pw@proxy:3128 inside",
        "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=abc==;EndpointSuffix=core.windows.net",
        "Endpoint=sb://x.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=abc=",
        "Server=db;Database=app;User Id=sa;Password=hunter2;",
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n-----END OPENSSH PRIVATE KEY-----",
        "-----BEGIN RSA PRIVATE KEY-----",
        "ghp_0123456789abcdefghijABCDEFGHIJ012345",
        "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
        "gho_0123456789abcdefghijABCDEFGHIJ012345",
        "glpat-0123456789abcdefghij",
        "xoxb-123456789012-1234567890123-abcdefghijklmnop",
        "xoxp-123456789012-abcdef",
        "sk-0123456789abcdefghijklmnopqrstuv",
        "sk-ant-api03-0123456789abcdefghijklmnop",
        "AKIAIOSFODNN7EXAMPLE",
        "ASIAIOSFODNN7EXAMPLE",
        "AIzaSyA-0123456789abcdefghijklmnopqrstu",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.abc",
        "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.abc",
        "Server=db;Pwd=hunter2",
        "Endpoint=x;SharedAccessSignature=sv=2020&sig=abc",
        "Server=db;\u{a0}Password=hunter2",
        "Server=db;Pa\u{17f}\u{17f}word=hunter2",
        "AccountName=a;Account\u{212a}ey=abc==",
        "ghu_0123456789abcdefghijABCDEFGHIJ012345",
        "ghs_0123456789abcdefghijABCDEFGHIJ012345",
        "ghr_0123456789abcdefghijABCDEFGHIJ012345",
        "glrt-0123456789abcdefghij",
        "gldt-0123456789abcdefghij",
        "npm_0123456789abcdefghijABCDEFGHIJ012345",
        "pypi-AgEIcHlwaS5vcmcCJGE0YjQ",
        "hf_0123456789abcdefghijABCDEFGHIJ0123",
    ];

    #[test]
    fn secret_values_are_recognised_by_shape_and_ordinary_values_pass() {
        for secret in SECRET_VALUES {
            assert!(is_secret_value(secret), "{secret} should be scrubbed");
        }
        for ordinary in [
            "/usr/local/bin:/usr/bin:/bin",
            "https://git.example.com/repo.git",
            "https://alice@git.example.com/repo.git",
            "http://127.0.0.1:8080/path@tag",
            "en_US.UTF-8",
            "sk_SK.UTF-8",
            "sk-short",
            "rs=0:di=01;34:ln=01;36:pi=40;33",
            "ghp_short",
            "AKIA",
            "xterm-256color",
            "eyJ",
        ] {
            assert!(!is_secret_value(ordinary), "{ordinary} should pass");
        }
        // The usual values pass without the patterns being compiled.
        for usual in [
            "/usr/local/bin:/usr/bin:/bin",
            "https://proxy.example.com:3128",
            "en_US.UTF-8",
            "xterm-256color",
        ] {
            assert!(!could_be_secret_value(usual), "{usual} should pass on its literals alone");
        }
    }

    /// A literal's word (`ghp` of `ghp_`, which the pattern writes
    /// `(ghp|gho|…)_`) is in its pattern: a typo in either shows here.
    #[test]
    fn each_shapes_literals_are_in_its_pattern() {
        for shape in &VALUE_SHAPES {
            for literal in shape.holds_one_of.iter().chain([&shape.and_holds]) {
                let pattern = shape.pattern.to_ascii_lowercase();
                for word in literal.split(|c: char| !c.is_ascii_alphanumeric()).filter(|w| !w.is_empty()) {
                    assert!(
                        pattern.contains(&word.to_ascii_lowercase()),
                        "{literal:?} is not in {pattern:?}"
                    );
                }
            }
        }
    }

    /// The literal check only skips the patterns: a value the patterns
    /// match always holds a literal. Mutated secrets (characters replaced,
    /// inserted, cut, case flipped) keep or lose their match; either way
    /// the check must not pass a value the patterns catch.
    #[test]
    fn no_value_the_patterns_match_skips_them() {
        let alphabet: Vec<char> = "aZ09_-.:;/@= \nkK\u{212a}\u{17f}".chars().collect();
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = |bound: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % bound as u64) as usize
        };
        let (mut matched, mut tried) = (0, 0);
        for secret in SECRET_VALUES {
            for _ in 0..300 {
                let mut chars: Vec<char> = secret.chars().collect();
                for _ in 0..1 + next(3) {
                    let at = next(chars.len() + 1);
                    match next(4) {
                        0 if at < chars.len() => chars[at] = alphabet[next(alphabet.len())],
                        1 => chars.insert(at, alphabet[next(alphabet.len())]),
                        2 if at < chars.len() => drop(chars.remove(at)),
                        _ if at < chars.len() => chars[at] = flip_case(chars[at]),
                        _ => {}
                    }
                }
                let value: String = chars.into_iter().collect();
                tried += 1;
                if secret_value_patterns().is_match(&value) {
                    matched += 1;
                    assert!(could_be_secret_value(&value), "{value:?} matches but holds no literal");
                }
            }
        }
        // The mutations must exercise both sides, or the check proves nothing.
        assert!(matched > tried / 4 && matched < tried, "{matched} of {tried} mutations matched");
    }

    fn flip_case(c: char) -> char {
        if c.is_ascii_uppercase() {
            c.to_ascii_lowercase()
        } else {
            c.to_ascii_uppercase()
        }
    }
}
