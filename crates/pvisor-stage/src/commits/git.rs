//! The host's `git`, run so that nothing a repository or the environment
//! says can make it run code: no system or global config, hooks pointed at
//! `/dev/null`, no fsmonitor, pager, external diff or ssh command, no
//! terminal prompt, an environment holding only `PATH` and what is set
//! here. The repository's own `config` is still read (its object format
//! and layout are needed), but only the host's, never the stage's.

use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// One git directory (and, for a quarantine, where its objects go and
/// which host objects it may read).
#[derive(Clone, Debug)]
pub struct Git {
    git_dir: PathBuf,
    /// `GIT_OBJECT_DIRECTORY` and `GIT_ALTERNATE_OBJECT_DIRECTORIES`.
    objects: Option<(PathBuf, PathBuf)>,
}

/// What a git command printed and how it ended.
#[derive(Debug)]
pub struct Ran {
    pub ok: bool,
    pub code: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: String,
}

/// Settings that would otherwise make git run a program named by config.
const OVERRIDES: &[&str] = &[
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.pager=cat",
    "core.sshCommand=false",
    "core.askPass=false",
    "diff.external=",
    "credential.helper=",
    "gc.auto=0",
    "maintenance.auto=false",
    "protocol.allow=never",
];

impl Git {
    /// The repository whose git directory is `git_dir` (the host's).
    pub fn at(git_dir: &Path) -> Self {
        Self { git_dir: git_dir.to_path_buf(), objects: None }
    }

    /// A quarantine: `git_dir` with its own `objects`, reading the host's
    /// `host_objects` as an alternate, so nothing is written to the host.
    pub fn quarantine(git_dir: &Path, host_objects: &Path) -> Self {
        Self {
            git_dir: git_dir.to_path_buf(),
            objects: Some((git_dir.join("objects"), host_objects.to_path_buf())),
        }
    }

    /// The git directory it runs in.
    pub fn dir(&self) -> &Path {
        &self.git_dir
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("git");
        cmd.env_clear();
        if let Some(path) = std::env::var_os("PATH") {
            cmd.env("PATH", path);
        }
        cmd.env("GIT_DIR", &self.git_dir)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("HOME", "/nonexistent")
            .env("LC_ALL", "C");
        if let Some((objects, alternate)) = &self.objects {
            cmd.env("GIT_OBJECT_DIRECTORY", objects).env("GIT_ALTERNATE_OBJECT_DIRECTORIES", alternate);
        }
        for setting in OVERRIDES {
            cmd.args(["-c", setting]);
        }
        // Applying to a repository another user owns (pvisor run by root)
        // is what the user asked for; git would otherwise refuse it.
        cmd.arg("-c").arg(safe_directory(&self.git_dir));
        cmd.args(args).current_dir(&self.git_dir);
        cmd
    }

    /// Runs `git ARGS`, feeding it `input`.
    pub fn run(&self, args: &[&str], input: Option<&[u8]>) -> std::io::Result<Ran> {
        let mut cmd = self.command(args);
        cmd.stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn()?;
        if let (Some(bytes), Some(mut stdin)) = (input, child.stdin.take()) {
            // The child may exit early (an error); its status says why.
            let _ = stdin.write_all(bytes);
        }
        let out = child.wait_with_output()?;
        Ok(Ran {
            ok: out.status.success(),
            code: out.status.code(),
            stdout: out.stdout,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }

    /// Runs `git ARGS` with stdin read from `input` (a file).
    pub fn run_from(&self, args: &[&str], input: std::fs::File) -> std::io::Result<Ran> {
        let out = self.command(args).stdin(input).output()?;
        Ok(Ran {
            ok: out.status.success(),
            code: out.status.code(),
            stdout: out.stdout,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }

    /// Runs `git ARGS` with stdout written to `output` (a file).
    pub fn run_into(&self, args: &[&str], input: &[u8], output: std::fs::File) -> std::io::Result<Ran> {
        let mut child =
            self.command(args).stdin(Stdio::piped()).stdout(output).stderr(Stdio::piped()).spawn()?;
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(input);
        }
        let out = child.wait_with_output()?;
        Ok(Ran {
            ok: out.status.success(),
            code: out.status.code(),
            stdout: Vec::new(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

/// `safe.directory=<the work tree>` for a git directory `.../WS/.git`.
fn safe_directory(git_dir: &Path) -> std::ffi::OsString {
    let top = if git_dir.file_name() == Some(OsStr::new(".git")) {
        git_dir.parent().unwrap_or(git_dir)
    } else {
        git_dir
    };
    let mut setting = std::ffi::OsString::from("safe.directory=");
    setting.push(top);
    setting
}
