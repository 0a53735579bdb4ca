//! A small typed QMP client: the eleven commands the vm executor issues.
//!
//! The `qapi` crate generates the whole QAPI schema of one QEMU release and
//! pulls in its own async runtime glue; pvisor needs `stop`, `cont`, `quit`,
//! `query-status`, `getfd`, `migrate`, `migrate-incoming`, `query-migrate`
//! and two migration settings, so
//! the commands are typed here (docs/vm-executor.md). Asynchronous events are
//! skipped while waiting for a command's answer.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use serde::{de::DeserializeOwned, Deserialize, Serialize};

/// A QMP command and its arguments.
#[derive(Debug, Serialize)]
#[serde(tag = "execute", content = "arguments")]
pub(crate) enum Command {
    #[serde(rename = "qmp_capabilities")]
    Capabilities,
    #[serde(rename = "stop")]
    Stop,
    #[serde(rename = "cont")]
    Cont,
    #[serde(rename = "quit")]
    Quit,
    #[serde(rename = "query-status")]
    QueryStatus,
    /// Each drive and its I/O status (`nospace` once a write hit ENOSPC).
    #[serde(rename = "query-block")]
    QueryBlock,
    #[serde(rename = "migrate")]
    Migrate { uri: String },
    #[serde(rename = "query-migrate")]
    QueryMigrate,
    /// Names the descriptor sent with this command (SCM_RIGHTS).
    #[serde(rename = "getfd")]
    GetFd { fdname: String },
    #[serde(rename = "migrate-set-capabilities")]
    MigrateSetCapabilities { capabilities: Vec<Capability> },
    /// Loads the state of a VM started with `-incoming defer`.
    #[serde(rename = "migrate-incoming")]
    MigrateIncoming { uri: String },
    #[serde(rename = "migrate-set-parameters")]
    MigrateSetParameters {
        #[serde(rename = "max-bandwidth")]
        max_bandwidth: u64,
    },
}

#[derive(Debug, Serialize)]
pub(crate) struct Capability {
    pub capability: &'static str,
    pub state: bool,
}

/// RAM blocks backed by a shared file are not copied into the stream (the
/// file holds them). QEMU 7.2 has no command-line switch for it, so both
/// ends set it over QMP: the stream carries the capability's extra fields.
pub(crate) fn ignore_shared(qmp: &mut Qmp) -> Result<(), QmpError> {
    let capabilities = vec![Capability { capability: "x-ignore-shared", state: true }];
    qmp.execute::<Empty>(&Command::MigrateSetCapabilities { capabilities }).map(|_| ())
}

#[derive(Debug, Deserialize)]
pub(crate) struct Status {
    pub status: String,
}

/// One drive of `query-block`.
#[derive(Debug, Deserialize)]
pub(crate) struct BlockInfo {
    #[serde(rename = "io-status", default)]
    pub io_status: Option<String>,
    #[serde(default)]
    pub inserted: Option<BlockImage>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct BlockImage {
    pub file: String,
}

#[derive(Debug, Deserialize)]
pub(crate) struct MigrationInfo {
    #[serde(default)]
    pub status: Option<String>,
    #[serde(rename = "error-desc", default)]
    pub error_desc: Option<String>,
}

/// An empty `{}` return.
#[derive(Debug, Deserialize)]
pub(crate) struct Empty {}

#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    #[error("QMP connection: {0}")]
    Io(#[from] io::Error),
    #[error("QMP {command} failed: {class}: {desc}")]
    Command { command: String, class: String, desc: String },
    #[error("QMP sent something unexpected: {0}")]
    Protocol(String),
    /// The migration of the machine state into its file ended in failure.
    #[error("saving the machine state failed: {0}")]
    SaveFailed(String),
    #[error("saving the machine state took over {0} s")]
    SaveTimeout(u64),
}

#[derive(Debug, Deserialize)]
struct ErrorBody {
    class: String,
    desc: String,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Message {
    Return {
        #[serde(rename = "return")]
        value: serde_json::Value,
    },
    Error {
        error: ErrorBody,
    },
    Event {
        #[serde(rename = "event")]
        _event: String,
    },
    Greeting {
        #[serde(rename = "QMP")]
        _qmp: serde_json::Value,
    },
}

#[derive(Debug)]
pub(crate) struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Qmp {
    /// Reads the greeting and leaves capabilities negotiation mode.
    pub(crate) fn connect(stream: UnixStream, timeout: Duration) -> Result<Self, QmpError> {
        stream.set_read_timeout(Some(timeout))?;
        let writer = stream.try_clone()?;
        let mut qmp = Self { reader: BufReader::new(stream), writer };
        match qmp.read()? {
            Message::Greeting { .. } => {}
            other => return Err(QmpError::Protocol(format!("expected the greeting, got {other:?}"))),
        }
        qmp.execute::<Empty>(&Command::Capabilities)?;
        Ok(qmp)
    }

    fn read(&mut self) -> Result<Message, QmpError> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(QmpError::Io(io::Error::new(io::ErrorKind::UnexpectedEof, "QEMU closed QMP")));
        }
        serde_json::from_str(&line).map_err(|e| QmpError::Protocol(format!("{e}: {}", line.trim())))
    }

    /// Runs `command` and decodes its return value.
    pub(crate) fn execute<R: DeserializeOwned>(&mut self, command: &Command) -> Result<R, QmpError> {
        self.execute_with(command, None)
    }

    /// Runs `command` with `fd` attached to its bytes (for `getfd`).
    pub(crate) fn execute_with<R: DeserializeOwned>(
        &mut self,
        command: &Command,
        fd: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> Result<R, QmpError> {
        let mut line = serde_json::to_vec(command).map_err(|e| QmpError::Protocol(e.to_string()))?;
        line.push(b'\n');
        match fd {
            Some(fd) => pvisor_sandbox::sys::send_fd_with(&self.writer, fd, &line)?,
            None => self.writer.write_all(&line)?,
        }
        loop {
            match self.read()? {
                Message::Return { value } => {
                    return serde_json::from_value(value).map_err(|e| QmpError::Protocol(e.to_string()))
                }
                Message::Error { error } => {
                    let name = serde_json::to_value(command)
                        .ok()
                        .and_then(|v| v.get("execute").and_then(|e| e.as_str()).map(str::to_owned))
                        .unwrap_or_default();
                    return Err(QmpError::Command { command: name, class: error.class, desc: error.desc });
                }
                Message::Event { .. } | Message::Greeting { .. } => {}
            }
        }
    }
}

/// Migrates the machine state into `file` (opened by pvisor and passed to
/// QEMU, not `exec:cat`, whose last writes could still be in flight when
/// QEMU says "completed") and waits until QEMU reports the end.
pub(crate) fn migrate_to_file(
    qmp: &mut Qmp,
    file: std::fs::File,
    named_ram: bool,
    timeout: Duration,
) -> Result<(), QmpError> {
    let started = std::time::Instant::now();
    if named_ram {
        ignore_shared(qmp)?;
    }
    // The default cap (32 MiB/s in QEMU 7.2) doubles the save time.
    qmp.execute::<Empty>(&Command::MigrateSetParameters { max_bandwidth: 8 << 30 })?;
    use std::os::fd::AsFd;
    qmp.execute_with::<Empty>(&Command::GetFd { fdname: "pvisor-state".into() }, Some(file.as_fd()))?;
    drop(file);
    qmp.execute::<Empty>(&Command::Migrate { uri: "fd:pvisor-state".into() })?;
    loop {
        let info: MigrationInfo = qmp.execute(&Command::QueryMigrate)?;
        match info.status.as_deref() {
            Some("completed") => return Ok(()),
            Some("failed") | Some("cancelled") => {
                return Err(QmpError::SaveFailed(info.error_desc.unwrap_or_default()))
            }
            _ if started.elapsed() > timeout => return Err(QmpError::SaveTimeout(timeout.as_secs())),
            _ => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_serialize_as_qmp_expects() {
        let s = |c: Command| serde_json::to_string(&c).unwrap();
        assert_eq!(s(Command::Stop), r#"{"execute":"stop"}"#);
        assert_eq!(s(Command::Capabilities), r#"{"execute":"qmp_capabilities"}"#);
        assert_eq!(
            s(Command::Migrate { uri: "exec:cat > x".into() }),
            r#"{"execute":"migrate","arguments":{"uri":"exec:cat > x"}}"#
        );
        assert_eq!(
            s(Command::MigrateSetParameters { max_bandwidth: 1 }),
            r#"{"execute":"migrate-set-parameters","arguments":{"max-bandwidth":1}}"#
        );
    }
}
