//! Running commands: spawning each in its own session (optionally chrooted
//! into a prepared sandbox root, optionally on a terminal of its own),
//! pumping its output into frames, signals and resizes, and the reaper that
//! collects every child PID 1 inherits.

use std::collections::HashMap;
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use pvisor_agent_proto::{Confinement, GuestContainer, Reply, TerminalSize};
use rustix::mount::MountFlags;
use rustix::process::{Pid, WaitOptions};

use crate::confine;
use crate::container::Entry;
use crate::init::mount;
use crate::link::Writer;
use crate::pty;
use crate::{Agent, Out};

/// How long output pumps may run on after the process exits (a background
/// child holding the pipes open must not delay `Exited` forever).
const OUTPUT_GRACE: Duration = Duration::from_millis(300);

/// The running execs: where each one's exit status goes, by pid, and what
/// the requests about it need.
#[derive(Default)]
pub(crate) struct ExecTable {
    by_pid: HashMap<i32, Sender<libc::c_int>>,
    groups: HashMap<u32, i32>,
    /// The memory group of each running exec that has one (its path).
    memory_groups: HashMap<u32, String>,
    /// The running guest containers' namespaces.
    containers: crate::container::Containers,
    stdin: HashMap<u32, Writer>,
    /// The master of each running exec's terminal, for `Resize`.
    terminals: HashMap<u32, OwnedFd>,
    /// Exit statuses already reported, for `Poll` after a restore.
    finished: HashMap<u32, (Option<i32>, Option<i32>)>,
}
pub(crate) type Execs = Arc<Mutex<ExecTable>>;

/// Reaps every child (PID 1 inherits orphans). It first *peeks* at an exited
/// child, then reaps it under the table lock, which `exec` holds while
/// spawning and registering: a child whose exec failed is reaped by
/// `Command::spawn` itself (reaping it here first would make std panic), and
/// an exec's child is always registered before it can be reaped.
pub(crate) fn reap(execs: Execs) {
    loop {
        // libc's waitid: rustix's reports no pid, and the peek is only
        // useful with one.
        // SAFETY: siginfo_t is plain data that waitid writes into (and only
        // there); WNOWAIT leaves the child reapable; once waitid succeeded
        // with WEXITED, si_pid is set.
        let peeked = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let rc = libc::waitid(libc::P_ALL, 0, &mut info, libc::WEXITED | libc::WNOWAIT);
            (rc >= 0).then(|| info.si_pid())
        };
        let Some(child) = peeked.and_then(Pid::from_raw) else {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        let pid = child.as_raw_nonzero().get();
        let mut table = execs.lock().unwrap_or_else(|p| p.into_inner());
        let status = match rustix::process::waitpid(Some(child), WaitOptions::NOHANG) {
            Ok(Some((reaped, status))) if reaped == child => status.as_raw(),
            _ => continue, // spawn reaped it (a failed exec)
        };
        table.exited(pid, status);
    }
}

impl ExecTable {
    /// Registers the just-spawned child `pid` of an exec (under the table
    /// lock, so the reaper cannot have reaped it yet); its exit status
    /// arrives on the receiver.
    fn register(&mut self, pid: i32) -> Receiver<libc::c_int> {
        let (status_tx, status_rx) = mpsc::channel();
        self.by_pid.insert(pid, status_tx);
        status_rx
    }

    /// Hands the exit `status` of child `pid` to its exec. A child that is
    /// no exec's (an orphan PID 1 inherited) is forgotten: kept, its status
    /// would be taken by a later exec given the same pid, which would then
    /// be reported exited while it runs.
    fn exited(&mut self, pid: i32, status: libc::c_int) {
        if let Some(tx) = self.by_pid.remove(&pid) {
            let _ = tx.send(status);
        }
    }
}

impl Agent {
    /// Queues `payload` for exec `id`'s stdin; a closed or overrun stdin is dropped.
    pub(crate) fn stdin(&self, id: u32, payload: Vec<u8>) {
        let mut table = self.execs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(stdin) = table.stdin.get(&id) {
            if !stdin.push(payload) {
                table.stdin.remove(&id);
            }
        }
    }

    pub(crate) fn close_stdin(&self, id: u32) {
        self.execs.lock().unwrap_or_else(|p| p.into_inner()).stdin.remove(&id);
    }

    /// Sends `signal` to exec `id`'s process group, if it still runs.
    pub(crate) fn signal(&self, id: u32, signal: i32) {
        let group = self.execs.lock().unwrap_or_else(|p| p.into_inner()).groups.get(&id).copied();
        if let Some(pgid) = group {
            // libc's kill: rustix builds a `Signal` safely only for the named
            // ones, and the host may forward any number (a real-time signal).
            // SAFETY: kill takes no pointers.
            unsafe { libc::kill(-pgid, signal) };
        }
    }

    pub(crate) fn status(&self, id: u32) {
        let table = self.execs.lock().unwrap_or_else(|p| p.into_inner());
        let running = table.groups.contains_key(&id);
        let (code, signal) = table.finished.get(&id).copied().unwrap_or((None, None));
        drop(table);
        self.send(Reply::Status { id, running, code, signal }, Vec::new());
    }

    pub(crate) fn poll(&self, id: u32) {
        let finished = self.execs.lock().unwrap_or_else(|p| p.into_inner()).finished.get(&id).copied();
        if let Some((code, signal)) = finished {
            self.send(Reply::Exited { id, code, signal }, Vec::new());
        }
        self.send(Reply::Done { op: "poll".into() }, Vec::new());
    }

    /// Sets exec `id`'s terminal size, if it has a terminal.
    pub(crate) fn resize(&self, id: u32, size: TerminalSize) {
        let table = self.execs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(master) = table.terminals.get(&id) {
            // Nothing to answer (as for a signal): a size the kernel
            // refuses leaves the old one.
            let _ = pty::resize(master, size);
        }
    }

    pub(crate) fn exec(&mut self, request: ExecRequest) {
        let ExecRequest { id, argv, env, cwd, root, output, terminal, confinement } = request;
        let container = confinement.as_ref().and_then(|c| c.container.clone());
        let memory_group = container.as_ref().filter(|c| c.memory_max.is_some()).map(|c| c.cgroup());
        let failed = |errno: i32, message: String| Reply::ExecFailed { id, errno, message };
        let Some((program, args)) = argv.split_first() else {
            return self.send(failed(libc::EINVAL, "empty argv".into()), Vec::new());
        };
        if terminal.is_some() && output.is_some() {
            let message = "a terminal's output is streamed; it cannot also go to a log file".into();
            return self.send(failed(libc::EINVAL, message), Vec::new());
        }
        let mut command = Command::new(program);
        command.args(args).env_clear().envs(env);
        // Prepared first: a terminal comes from the root's own devpts. A
        // guest container's process enters its namespaces instead of a
        // chroot.
        let entry = match self.container_entry(container.as_ref(), root.as_deref()) {
            Ok(entry) => entry.map(Arc::new),
            Err(e) => return self.send(failed(libc::EIO, e.to_string()), Vec::new()),
        };
        let chrooted = root.as_deref().filter(|_| entry.is_none());
        let confine = match chrooted.map(|r| prepare_root(r).map(|()| r)) {
            Some(Err(e)) => {
                return self.send(failed(libc::EIO, format!("cannot prepare the root: {e}")), Vec::new())
            }
            Some(Ok(r)) => Some(
                CString::new(r.as_os_str().as_bytes())
                    .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL)),
            ),
            None => None,
        };
        // A guest container's terminal comes from its own devpts.
        let ptmx = match (&entry, terminal) {
            (Some(entry), Some(_)) => match entry.ptmx() {
                Ok(master) => Some(master),
                Err(e) => {
                    return self.send(failed(libc::EIO, format!("cannot open a terminal: {e}")), Vec::new())
                }
            },
            _ => None,
        };
        let stdio = match streams(&mut command, root.as_deref(), ptmx, terminal, output.as_deref()) {
            Ok(stdio) => stdio,
            Err(e) => {
                let errno = e.raw_os_error().unwrap_or(libc::EIO);
                return self.send(failed(errno, e.to_string()), Vec::new());
            }
        };
        let cwd = match CString::new(cwd.as_os_str().as_bytes()) {
            Ok(c) => c,
            Err(_) => return self.send(failed(libc::EINVAL, "cwd has a NUL byte".into()), Vec::new()),
        };
        let confine = match confine.transpose() {
            Ok(c) => c,
            Err(e) => return self.send(failed(libc::EINVAL, e.to_string()), Vec::new()),
        };
        let confined = match confinement.as_deref().map(confine::prepare).transpose() {
            Ok(ready) => ready,
            Err(e) => {
                let errno = e.raw_os_error().unwrap_or(libc::EINVAL);
                return self.send(failed(errno, format!("cannot confine the process: {e}")), Vec::new());
            }
        };
        let controlling = matches!(stdio, Streams::Terminal(_));
        let entering = entry.clone();
        // SAFETY: the closure runs between fork and exec, where only
        // async-signal-safe work is allowed: rustix's setsid, ioctl, chroot
        // and chdir are bare syscalls, the CStrings and the confinement were
        // built before the fork, and an Errno becomes an io::Error without
        // allocating.
        unsafe {
            command.pre_exec(move || {
                rustix::process::setsid()?;
                if controlling {
                    // std has made the slave fd 0 by now; the new session
                    // takes it as its controlling terminal.
                    rustix::process::ioctl_tiocsctty(rustix::stdio::stdin())?;
                }
                if let Some(entry) = &entering {
                    entry.enter()?;
                } else if let Some(root) = &confine {
                    rustix::process::chroot(root.as_c_str())?;
                }
                rustix::process::chdir(cwd.as_c_str())?;
                // Last: the user and capabilities it takes away are what
                // the steps above needed.
                if let Some(confined) = &confined {
                    confined.apply()?;
                }
                Ok(())
            });
        }
        // Hold the table while spawning so the reaper cannot lose this pid's status.
        let mut table = self.execs.lock().unwrap_or_else(|p| p.into_inner());
        let spawned = match &entry {
            Some(entry) => entry.spawn_in(|| command.spawn()),
            None => command.spawn(),
        };
        let mut child = match spawned {
            Ok(child) => child,
            Err(e) => {
                drop(table);
                let errno = e.raw_os_error().unwrap_or(libc::EIO);
                return self.send(Reply::ExecFailed { id, errno, message: e.to_string() }, Vec::new());
            }
        };
        // The slave's copies in `command` close now: the master reads EIO
        // once the process (and whatever inherited the slave) is gone.
        drop(command);
        let pid = child.id() as i32;
        if let (Some(Entry::New { .. }), Some(container)) = (entry.as_deref(), &container) {
            // Later processes of the container join it; if its PID 1 has
            // ended already, they fail to, as they should.
            if let Err(e) = table.containers.started(&container.name, child.id(), id) {
                eprintln!("pvisor-agent: container {}: its namespaces: {e}", container.name);
            }
        }
        let status_rx = table.register(pid);
        let out = self.out.clone();
        let started = Gate::default();
        let pumps = relay(&out, &mut table, id, stdio, &mut child, &started);
        drop(table);
        self.send(Reply::Started { id, pid }, Vec::new());
        started.open();
        // Running (signals, `Status`, OOM news) only once `Started` is queued:
        // nothing of this exec may reach the host before it. The request
        // loop is this thread, so no signal for it can come in between.
        let mut table = self.execs.lock().unwrap_or_else(|p| p.into_inner());
        table.groups.insert(id, pid);
        table.memory_groups.extend(memory_group.map(|g| (id, g)));
        drop(table);
        let (execs, oom) = (self.execs.clone(), self.oom.clone());
        std::thread::spawn(move || report_exit(id, status_rx, pumps, &execs, &oom, &out));
    }
}

/// Hands exec `id`'s stdin to a writer and its output to pumps (a
/// terminal's master, or the child's pipes); returns the pumps' EOF channels.
fn relay(
    out: &Out,
    table: &mut ExecTable,
    id: u32,
    stdio: Streams,
    child: &mut std::process::Child,
    started: &Gate,
) -> [Option<Receiver<()>>; 2] {
    match stdio {
        Streams::Terminal(master) => {
            let (reader, writer) = match (pty::dup(&master), pty::dup(&master)) {
                (Ok(r), Ok(w)) => (Some(r), Some(w)),
                _ => (None, None),
            };
            if let Some(writer) = writer {
                table.stdin.insert(id, Writer::spawn(writer, out.clone(), Reply::StdinAck { id }, || {}));
            }
            table.terminals.insert(id, master);
            [reader.map(|r| pump(r, out.clone(), move || Reply::Stdout { id }, started.clone())), None]
        }
        Streams::Pipes => {
            if let Some(stdin) = child.stdin.take() {
                table.stdin.insert(id, Writer::spawn(stdin, out.clone(), Reply::StdinAck { id }, || {}));
            }
            [
                child
                    .stdout
                    .take()
                    .map(|r| pump(r, out.clone(), move || Reply::Stdout { id }, started.clone())),
                child
                    .stderr
                    .take()
                    .map(|r| pump(r, out.clone(), move || Reply::Stderr { id }, started.clone())),
            ]
        }
    }
}

/// Waits for exec `id`'s status (from the reaper) and its output (for at
/// most [`OUTPUT_GRACE`] more), then forgets it and reports its exit.
fn report_exit(
    id: u32,
    status_rx: Receiver<libc::c_int>,
    pumps: [Option<Receiver<()>>; 2],
    execs: &Execs,
    oom: &crate::oom::OomWatch,
    out: &Out,
) {
    let status = status_rx.recv().unwrap_or(0);
    let grace = Instant::now() + OUTPUT_GRACE;
    for done in pumps.into_iter().flatten() {
        let _ = done.recv_timeout(grace.saturating_duration_since(Instant::now()));
    }
    let (code, signal) = if libc::WIFEXITED(status) {
        (Some(libc::WEXITSTATUS(status)), None)
    } else {
        (None, Some(libc::WTERMSIG(status)))
    };
    if signal == Some(libc::SIGKILL) {
        // Perhaps an OOM kill: its news goes out before the exit.
        oom.scan();
    }
    let mut table = execs.lock().unwrap_or_else(|p| p.into_inner());
    table.stdin.remove(&id);
    table.groups.remove(&id);
    table.memory_groups.remove(&id);
    table.containers.exited(id);
    table.terminals.remove(&id);
    table.finished.insert(id, (code, signal));
    drop(table);
    let _ = out.send((Reply::Exited { id, code, signal }, Vec::new(), None));
}

impl Agent {
    /// How the process of a guest container enters it (`None` for any
    /// other process).
    fn container_entry(
        &self,
        container: Option<&GuestContainer>,
        root: Option<&Path>,
    ) -> io::Result<Option<Entry>> {
        let Some(container) = container else { return Ok(None) };
        let Some(root) = root else {
            let message = format!("container {} has no root", container.name);
            return Err(io::Error::new(io::ErrorKind::InvalidInput, message));
        };
        let table = self.execs.lock().unwrap_or_else(|p| p.into_inner());
        let entry = crate::container::prepare(container, root, &table.containers).map_err(|e| {
            io::Error::new(e.kind(), format!("cannot prepare container {}: {e}", container.name))
        })?;
        Ok(Some(entry))
    }
}

/// What [`Request::Exec`](pvisor_agent_proto::Request::Exec) asks for.
pub(crate) struct ExecRequest {
    pub(crate) id: u32,
    pub(crate) argv: Vec<String>,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) cwd: PathBuf,
    pub(crate) root: Option<PathBuf>,
    pub(crate) output: Option<PathBuf>,
    pub(crate) terminal: Option<TerminalSize>,
    pub(crate) confinement: Option<Box<Confinement>>,
}

/// Where a process's stdio goes: pipes (or a log file) set on the
/// `Command`, or a terminal whose master the agent keeps.
enum Streams {
    Pipes,
    Terminal(OwnedFd),
}

/// Stdin from a pipe; stdout and stderr to pipes, or appended to `output`.
fn pipes(command: &mut Command, output: Option<&Path>) -> io::Result<Streams> {
    command.stdin(Stdio::piped());
    match output {
        None => {
            command.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        Some(path) => {
            let open_log = || {
                if let Some(parent) = path.parent() {
                    fs::create_dir_all(parent)?;
                }
                OpenOptions::new().create(true).append(true).mode(0o600).open(path)
            };
            let log =
                open_log().map_err(|e| io::Error::new(e.kind(), format!("cannot open the log: {e}")))?;
            command.stdout(log.try_clone()?).stderr(log);
        }
    }
    Ok(Streams::Pipes)
}

/// The execs whose process group leader still runs.
/// The running execs an OOM kill in memory cgroup `memcg` concerns: those
/// in that group, or every one for a kill of the whole guest (`/`) or of
/// an unknown group (the kernel's report may be rate-limited away).
pub(crate) fn running_in(execs: &Execs, memcg: Option<&str>) -> Vec<u32> {
    let table = execs.lock().unwrap_or_else(|p| p.into_inner());
    let known = memcg.filter(|m| table.memory_groups.values().any(|g| g == m));
    let ids = table.groups.keys().copied();
    match known {
        Some(memcg) => ids.filter(|id| table.memory_groups.get(id).is_some_and(|g| g == memcg)).collect(),
        // A kill outside every group is of the guest: the execs outside
        // groups are concerned, and so are those in one (the whole VM
        // ran out), as before groups existed.
        None => ids.collect(),
    }
}

/// Connects `command`'s stdio: a terminal (from the root's own devpts) or
/// pipes (stdout and stderr to a log file in the guest, with `output`).
fn streams(
    command: &mut Command,
    root: Option<&Path>,
    ptmx: Option<OwnedFd>,
    terminal: Option<TerminalSize>,
    output: Option<&Path>,
) -> io::Result<Streams> {
    match terminal {
        Some(size) => match ptmx {
            Some(master) => pty::pair(master, size),
            None => pty::open(root, size),
        }
        .and_then(|pair| {
            command
                .stdin(pty::dup(&pair.slave)?)
                .stdout(pty::dup(&pair.slave)?)
                .stderr(File::from(pair.slave));
            Ok(Streams::Terminal(pair.master))
        }),
        None => pipes(command, output),
    }
}

/// Copies a pipe into output frames; the returned channel fires at EOF.
fn pump(
    mut r: impl Read + Send + 'static,
    out: Out,
    frame: impl Fn() -> Reply + Send + 'static,
    started: Gate,
) -> Receiver<()> {
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::spawn(move || {
        // A fast process's first output must not overtake its `Started`:
        // the host reads the first frame of an exec as its start.
        started.wait();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match r.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let _ = out.send((frame(), buf[..n].to_vec(), None));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let _ = done_tx.send(());
    });
    done_rx
}

/// Makes a sandbox root usable by chrooted commands: `/proc`, `/dev` (with
/// `/dev/pts` and `/dev/shm`) and a world-writable `/tmp`. Idempotent.
fn prepare_root(root: &Path) -> io::Result<()> {
    let proc_dir = root.join("proc");
    if proc_dir.join("self").exists() {
        return Ok(());
    }
    for (dir, mode) in [("proc", 0o555), ("dev", 0o755), ("sys", 0o555), ("tmp", 0o1777)] {
        let path = root.join(dir);
        if !path.is_dir() {
            fs::create_dir_all(&path)?;
            fs::set_permissions(&path, fs::Permissions::from_mode(mode))?;
        }
    }
    let at = |dir: &str| root.join(dir).to_string_lossy().into_owned();
    mount("proc", &at("proc"), "proc", MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC, "")?;
    mount("devtmpfs", &at("dev"), "devtmpfs", MountFlags::NOSUID, "")?;
    for (dir, fstype, data) in
        [("dev/pts", "devpts", "newinstance,ptmxmode=0666"), ("dev/shm", "tmpfs", "mode=1777")]
    {
        let _ = fs::create_dir_all(root.join(dir));
        let _ = mount(fstype, &at(dir), fstype, MountFlags::NOSUID | MountFlags::NOEXEC, data);
    }
    let _ = mount(
        "sysfs",
        &at("sys"),
        "sysfs",
        MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        "",
    );
    Ok(())
}

/// Opened once an exec's `Started` is queued; its output pumps wait for it
/// (the pipe holds what the process writes meanwhile).
#[derive(Clone, Default)]
struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    fn open(&self) {
        *self.0 .0.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.0 .1.notify_all();
    }

    fn wait(&self) {
        let mut open = self.0 .0.lock().unwrap_or_else(|p| p.into_inner());
        while !*open {
            open = self.0 .1.wait(open).unwrap_or_else(|p| p.into_inner());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An OOM kill in a pod container's memory group is its execs' news
    /// alone; one of the whole guest, or of a group no exec is in, is
    /// every exec's.
    #[test]
    fn an_oom_kill_in_a_memory_group_concerns_that_groups_execs() {
        let execs: Execs = Arc::default();
        {
            let mut table = execs.lock().expect("lock");
            table.groups.extend([(2, 100), (3, 101), (4, 102)]);
            table.memory_groups.extend([(2, "/pod-a".to_owned()), (3, "/pod-b".to_owned())]);
        }
        let sorted = |mut ids: Vec<u32>| {
            ids.sort_unstable();
            ids
        };
        assert_eq!(sorted(running_in(&execs, Some("/pod-a"))), [2]);
        assert_eq!(sorted(running_in(&execs, Some("/"))), [2, 3, 4]);
        assert_eq!(sorted(running_in(&execs, Some("/pod-gone"))), [2, 3, 4]);
        assert_eq!(sorted(running_in(&execs, None)), [2, 3, 4]);
    }

    /// An orphan's exit is forgotten, so an exec that later gets the same
    /// pid waits for its own exit; an exec's exit reaches it once.
    #[test]
    fn an_orphans_exit_is_never_taken_for_a_later_execs_with_its_pid() {
        let mut table = ExecTable::default();
        table.exited(4242, 9);
        let rx = table.register(4242);
        assert!(rx.try_recv().is_err(), "the orphan's status reached the exec");
        table.exited(4242, 0);
        assert_eq!(rx.try_recv().ok(), Some(0));
        assert!(table.by_pid.is_empty());
    }
}
