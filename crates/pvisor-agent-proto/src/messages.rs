//! The AgentCtl messages: [`Request`]s (host → guest), [`Reply`]s (guest →
//! host) and the types they carry. Only their shape lives here; how they
//! travel is [`framing`](crate::framing)'s business.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// A host directory the guest mounts live: the virtiofs device tagged
/// `tag` at `target`, a path inside the workspace (the container's root),
/// resolved beneath it; read-only when `read_only` (the host enforces it
/// too).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Share {
    pub tag: String,
    pub target: PathBuf,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
}

/// The guest NIC's IPv4 configuration: the address of the interface it
/// stands in for (a pod's `eth0`), whose MAC it already has.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Interface {
    /// The NIC's MAC (QEMU gave it the interface's): which guest link it is.
    pub mac: String,
    /// `ADDRESS/PREFIX`, e.g. `10.88.0.5/16`.
    pub address: String,
    /// The default route's gateway, if the namespace has one.
    pub gateway: Option<String>,
    pub mtu: u32,
}

/// Host → guest.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    Hello {
        version: u32,
    },
    /// Mounts the workspace overlay at `workspace` (the host path), sets the
    /// clock, and with `proxy_port` listens on guest `127.0.0.1:port`, each
    /// connection becoming a stream to pvisor's proxy (the guest has no NIC).
    /// With `delta`, the disk [`DELTA_SERIAL`](crate::DELTA_SERIAL) is
    /// finished from its manifest and layered above the base image; an agent
    /// older than the field refuses it (unknown field), so a stale guest
    /// image can never show the base alone.
    Setup {
        workspace: PathBuf,
        hostname: String,
        clock_unix_ns: i64,
        proxy_port: Option<u16>,
        #[serde(default)]
        delta: bool,
        /// The address the guest's NIC takes (a VM joined to a pod's
        /// network); absent for a VM without one, so older hosts' Setup
        /// parses unchanged.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        interface: Option<Interface>,
        /// The host directories to mount after the workspace; absent when
        /// none, so older hosts' Setup parses unchanged.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        shares: Vec<Share>,
        /// Assemble [`USERLAND_ROOT`](crate::USERLAND_ROOT) from the disks
        /// [`IMAGE_LOWER_SERIAL`](crate::IMAGE_LOWER_SERIAL) and
        /// [`IMAGE_DELTA_SERIAL`](crate::IMAGE_DELTA_SERIAL) (a root
        /// filesystem's base and delta) under a throw-away tmpfs, with the
        /// workspace bound at its own path inside. Left out when false, so
        /// an agent older than it refuses a Setup it cannot honour.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        userland: bool,
    },
    /// Payload: bytes from the proxy for guest connection `stream`.
    NetData {
        stream: u32,
    },
    /// The proxy closed `stream`.
    NetClose {
        stream: u32,
    },
    /// Connects `stream` to guest `127.0.0.1:port` (a host-initiated stream,
    /// for a service in the guest); answers `Done` or `Error`. Its bytes then
    /// travel as `NetData`/`NetClose` both ways, like proxy streams.
    NetConnect {
        stream: u32,
        port: u16,
    },
    /// One guest `NetData` chunk of `stream` was written to its host end:
    /// the guest may send another (flow control, as `Reply::NetAck` the
    /// other way; at most [`CREDITS`](crate::CREDITS) chunks in flight per stream).
    NetAck {
        stream: u32,
    },
    /// Starts a process in its own session and process group. With `root`
    /// it runs chrooted there (the agent first mounts `/proc`, `/dev` and
    /// `/tmp` inside it); `cwd` is then relative to `root`. With `output`,
    /// stdout and stderr are appended to that guest file instead of being
    /// streamed (a background command whose log outlives its host). With
    /// `terminal`, the process gets a new pseudo-terminal of that size as
    /// its controlling terminal and stdin, stdout and stderr (allocated in
    /// the devpts it sees, so `tty` names it); everything it writes then
    /// travels as `Stdout`.
    Exec {
        id: u32,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        cwd: PathBuf,
        #[serde(default)]
        root: Option<PathBuf>,
        #[serde(default)]
        output: Option<PathBuf>,
        // Left out when absent: an agent of an older image (a resumed
        // checkpoint's) refuses fields it does not know.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        terminal: Option<TerminalSize>,
        /// What the process is confined to (a container's OCI `process`);
        /// left out when absent, so an older agent refuses an exec it
        /// could not confine rather than run it unconfined.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        confinement: Option<Box<Confinement>>,
    },
    /// Sets the window size of exec `id`'s terminal (its foreground process
    /// group gets SIGWINCH). No reply, like `Signal`; an exec without a
    /// terminal is left alone.
    Resize {
        id: u32,
        size: TerminalSize,
    },
    /// Payload: bytes for the process's stdin.
    Stdin {
        id: u32,
    },
    CloseStdin {
        id: u32,
    },
    /// Sends `signal` to the process group of exec `id`.
    Signal {
        id: u32,
        signal: i32,
    },
    /// Replies with [`Reply::File`] carrying the contents from `offset`, at
    /// most `len` bytes and never more than [`MAX_PAYLOAD`](crate::MAX_PAYLOAD) (callers page).
    ReadFile {
        path: PathBuf,
        #[serde(default)]
        offset: u64,
        #[serde(default)]
        len: Option<u64>,
    },
    /// Payload: the new contents (appended with `append`, for paged uploads).
    WriteFile {
        path: PathBuf,
        mode: u32,
        #[serde(default)]
        append: bool,
    },
    /// File operations for the sandbox file API. Paths are resolved beneath
    /// `root` ([`resolve_in_root`](crate::resolve_in_root)): `..` and absolute symlinks stop at it.
    /// Each answers [`Reply::Done`], [`Reply::Stat`] or [`Reply::Listing`].
    FileOp {
        root: PathBuf,
        op: FileOp,
    },
    /// `sync`, then freeze the writable filesystems. Writers block until `Thaw`.
    Quiesce,
    Thaw,
    /// Sent after a restore or fork. Payload: fresh entropy from the host.
    /// Answers [`Reply::Restored`], or [`Reply::Error`] when the guest's
    /// CRNG could not be reseeded (the copy would repeat its parent's
    /// random stream, so the restore must not go on).
    Restored {
        clock_unix_ns: i64,
    },
    /// Answers [`Reply::Status`] for exec `id`.
    Status {
        id: u32,
    },
    /// Resends `Exited` for `id` if it has finished (it may have been sent to
    /// a host that no longer exists), then answers `Done`.
    Poll {
        id: u32,
    },
    /// Streams the overlay's upper layer as `Entry`/`Data` frames, then `ExportDone`.
    Export,
}

/// What an OCI runtime spec restricts a container's process to, applied by
/// the agent between fork and exec, in runc's order: rlimits, the bounding
/// set, the user (capabilities kept across it), the other capability sets,
/// the ambient set, `no_new_privs`, then the seccomp filter (installed
/// before the bounding set instead when `no_new_privs` is off, while the
/// process still holds `CAP_SYS_ADMIN`). Sysctls are written before the fork.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Confinement {
    pub uid: u32,
    pub gid: u32,
    pub additional_gids: Vec<u32>,
    /// `None`: the spec names no capabilities, and the sets are left as
    /// they are (runc's reading).
    pub capabilities: Option<Capabilities>,
    pub no_new_privileges: bool,
    pub rlimits: Vec<Rlimit>,
    /// `(key, value)`, the key in dotted form (`net.ipv4.ip_forward`):
    /// written to the guest's `/proc/sys`, never the host's.
    pub sysctl: Vec<(String, String)>,
    /// The spec's seccomp profile, compiled by the host (left out when
    /// absent, so an agent that cannot install one refuses the exec).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seccomp: Option<Seccomp>,
    /// The guest container the process runs in (a pod's container, in
    /// the pod's VM): its own pid and mount namespaces, and its memory
    /// group when it has a limit. Left out otherwise, so an older agent
    /// refuses what it could not isolate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<GuestContainer>,
}

/// A container inside a guest that several share (a pod's VM), as Kata
/// Containers' agent makes one: its first process (`start`) starts it, as
/// PID 1 of a new pid namespace, in a new mount namespace whose root is
/// the exec's `root` (nothing of the guest's other mounts is left in it,
/// `/dev` holds only the standard devices, `/proc`'s kernel settings are
/// read-only); later processes of the name join both namespaces; it ends
/// when its PID 1 does, and is never started again under that name. With
/// limits, its processes share a cgroup of the guest,
/// `/sys/fs/cgroup/pod-NAME`: `memory.max` (whose OOM kill ends all of them,
/// `memory.oom.group` as the kubelet sets it, and no other process),
/// `pids.max`, `cpu.max`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuestContainer {
    /// One plain name: ASCII letters, digits, `_`, `-` and `.`, at most
    /// [`GuestContainer::MAX_NAME`] bytes, not `.` or `..`.
    pub name: String,
    /// `memory.max` of its cgroup, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_max: Option<u64>,
    /// `pids.max` of its cgroup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids_max: Option<u64>,
    /// Its CPU time per 100 ms, in microseconds (`cpu.max`'s quota).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_max_us: Option<u64>,
    /// This process starts the container (its init); any other joins it,
    /// and fails when it is not running.
    #[serde(default)]
    pub start: bool,
}

impl GuestContainer {
    pub const MAX_NAME: usize = 128;

    /// Whether the name is one the guest takes (it becomes a path).
    pub fn name_is_plain(&self) -> bool {
        let name = &self.name;
        !name.is_empty()
            && name.len() <= Self::MAX_NAME
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
            && name != "."
            && name != ".."
    }

    /// Its cgroup's path in the cgroup tree, as the kernel's OOM report
    /// names it (`task_memcg=/pod-NAME`).
    pub fn cgroup(&self) -> String {
        format!("/pod-{}", self.name)
    }
}

/// A seccomp filter as classic BPF programs, installed in order with
/// `seccomp(SECCOMP_SET_MODE_FILTER, flags)`. The kernel runs every
/// installed program on each call and takes the most restrictive answer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Seccomp {
    /// Each program's instructions, one `struct sock_filter` per number:
    /// `code << 48 | jt << 40 | jf << 32 | k` ([`Seccomp::pack`]).
    pub programs: Vec<Vec<u64>>,
    /// `SECCOMP_FILTER_FLAG_*` bits passed with each program.
    pub flags: u32,
}

impl Seccomp {
    /// One instruction as it travels.
    pub fn pack(code: u16, jt: u8, jf: u8, k: u32) -> u64 {
        (u64::from(code) << 48) | (u64::from(jt) << 40) | (u64::from(jf) << 32) | u64::from(k)
    }

    /// `(code, jt, jf, k)` of a packed instruction.
    pub fn unpack(insn: u64) -> (u16, u8, u8, u32) {
        ((insn >> 48) as u16, (insn >> 40) as u8, (insn >> 32) as u8, insn as u32)
    }
}

/// Capability sets as masks: bit `n` is capability `n` (`CAP_CHOWN` is 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Capabilities {
    pub bounding: u64,
    pub effective: u64,
    pub permitted: u64,
    pub inheritable: u64,
    pub ambient: u64,
}

/// One resource limit: `resource` is Linux's number (`RLIMIT_NOFILE` is 7,
/// see [`RLIMITS`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rlimit {
    pub resource: u32,
    pub soft: u64,
    pub hard: u64,
}

/// The OCI names of Linux's resource limits, indexed by their number.
pub const RLIMITS: [&str; 16] = [
    "RLIMIT_CPU",
    "RLIMIT_FSIZE",
    "RLIMIT_DATA",
    "RLIMIT_STACK",
    "RLIMIT_CORE",
    "RLIMIT_RSS",
    "RLIMIT_NPROC",
    "RLIMIT_NOFILE",
    "RLIMIT_MEMLOCK",
    "RLIMIT_AS",
    "RLIMIT_LOCKS",
    "RLIMIT_SIGPENDING",
    "RLIMIT_MSGQUEUE",
    "RLIMIT_NICE",
    "RLIMIT_RTPRIO",
    "RLIMIT_RTTIME",
];

/// A terminal's size in character cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TerminalSize {
    pub rows: u16,
    pub cols: u16,
}

/// A file operation inside a sandbox root (see [`Request::FileOp`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum FileOp {
    /// Follows a final symlink.
    Stat {
        path: PathBuf,
    },
    /// Entries of a directory; with `depth` > 1, of its subdirectories too
    /// (at most [`MAX_LISTING`] entries). Names are relative to `path`.
    List {
        path: PathBuf,
        depth: u32,
    },
    /// Creates the directory and its parents, then sets `mode` on it.
    Mkdir {
        path: PathBuf,
        mode: u32,
    },
    /// Removes a file or symlink; a directory only with `recursive`.
    Remove {
        path: PathBuf,
        recursive: bool,
    },
    Rename {
        from: PathBuf,
        to: PathBuf,
    },
    /// `mode`, then (when given) owner and group.
    Chmod {
        path: PathBuf,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
    },
    /// Creates the parent directories of a file about to be written; both
    /// this and `Resolve` answer [`Reply::Resolved`] with the guest path.
    MkParents {
        path: PathBuf,
    },
    Resolve {
        path: PathBuf,
    },
}

/// Metadata of one file, as the sandbox file API reports it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FileStat {
    /// The path relative to the listed directory (a `List`), or as asked (`Stat`).
    pub path: PathBuf,
    pub kind: EntryKind,
    pub size: u64,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

/// Most entries one `List` returns.
pub const MAX_LISTING: usize = 100_000;

/// What a staged entry in the upper layer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    Dir,
    File,
    Symlink,
    /// A 0/0 character device: the lower path was deleted.
    Whiteout,
    Fifo,
}

/// Guest → host.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Reply {
    Hello {
        version: u32,
        agent: String,
        uptime_ms: u64,
    },
    /// `Setup` is done; how long each of the guest's setup steps took
    /// ([`crate::timing::PhaseClock`]).
    Ready {
        #[serde(default)]
        steps_us: Vec<(String, u64)>,
    },
    Started {
        id: u32,
        pid: i32,
    },
    ExecFailed {
        id: u32,
        errno: i32,
        message: String,
    },
    /// Payload: output bytes.
    Stdout {
        id: u32,
    },
    Stderr {
        id: u32,
    },
    /// Sent after all output of `id` (or after a short grace if a background
    /// child keeps the pipes open).
    Exited {
        id: u32,
        code: Option<i32>,
        signal: Option<i32>,
    },
    /// Payload: file contents.
    File {
        path: PathBuf,
    },
    Done {
        op: String,
    },
    Quiesced {
        frozen: Vec<PathBuf>,
    },
    /// How far the clock was stepped and the entropy the kernel now credits.
    Restored {
        clock_step_ns: i64,
        entropy_avail: u32,
    },
    /// One upper-layer entry; a file's bytes follow as `Data` and `Hole`
    /// frames totalling `size`.
    Entry {
        path: Vec<u8>,
        kind: EntryKind,
        mode: u32,
        mtime_ns: i64,
        size: u64,
        target: Option<Vec<u8>>,
        opaque: bool,
    },
    Data,
    /// The next `len` bytes of the file being exported are a hole: they
    /// read as zeros and were never written, so they are not sent, and the
    /// host leaves the same hole in the staged copy.
    Hole {
        len: u64,
    },
    Stat {
        stat: FileStat,
    },
    /// The guest path a `MkParents` or `Resolve` resolved to.
    Resolved {
        path: PathBuf,
    },
    /// `running` while its process group leader lives; `code`/`signal` once
    /// it exited; neither for an id this guest never ran.
    Status {
        id: u32,
        running: bool,
        code: Option<i32>,
        signal: Option<i32>,
    },
    Listing {
        entries: Vec<FileStat>,
        truncated: bool,
    },
    ExportDone {
        entries: u64,
        bytes: u64,
    },
    /// A guest process connected to the proxy port; the host opens `stream` to its proxy.
    NetOpen {
        stream: u32,
    },
    /// Payload: bytes the guest process sent on `stream`.
    NetData {
        stream: u32,
    },
    /// The guest process closed `stream`.
    NetClose {
        stream: u32,
    },
    /// The guest kernel's OOM killer killed process `pid` while exec `id`
    /// ran. The guest is one memory domain, so every running exec is told
    /// of every kill; the victim's own `Oom` precedes its `Exited`.
    Oom {
        id: u32,
        pid: i32,
    },
    /// One `Stdin` chunk of exec `id` was written to the process: the host
    /// may send another (flow control; the host keeps few chunks in flight).
    StdinAck {
        id: u32,
    },
    /// One `NetData` chunk of `stream` reached the guest process.
    NetAck {
        stream: u32,
    },
    Error {
        op: String,
        message: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setup_without_delta_means_none_and_an_unknown_field_is_refused() {
        let old = r#"{"type":"setup","workspace":"/w","hostname":"h","clock_unix_ns":1,"proxy_port":null}"#;
        match serde_json::from_str::<Request>(old).unwrap() {
            Request::Setup { delta, .. } => assert!(!delta),
            other => panic!("{other:?}"),
        }
        // What an agent that predates a field does with it: refuse, not ignore.
        let newer = r#"{"type":"setup","workspace":"/w","hostname":"h","clock_unix_ns":1,"proxy_port":null,"delta":true,"layers":2}"#;
        let e = serde_json::from_str::<Request>(newer).unwrap_err().to_string();
        assert!(e.contains("unknown field `layers`"), "{e}");
    }

    /// A Setup without a NIC is the shape older agents parse; one with a
    /// NIC carries its address.
    #[test]
    fn setup_names_an_interface_only_for_a_vm_with_a_nic() {
        let setup = |interface| Request::Setup {
            workspace: "/w".into(),
            hostname: "h".into(),
            clock_unix_ns: 1,
            proxy_port: None,
            delta: true,
            interface,
            shares: Vec::new(),
            userland: false,
        };
        let plain = serde_json::to_value(setup(None)).unwrap();
        assert!(
            plain.get("interface").is_none()
                && plain.get("shares").is_none()
                && plain.get("userland").is_none(),
            "{plain}"
        );
        let nic = Interface {
            mac: "66:96:de:a5:1a:58".into(),
            address: "10.88.0.7/16".into(),
            gateway: Some("10.88.0.1".into()),
            mtu: 1450,
        };
        let json = serde_json::to_string(&setup(Some(nic.clone()))).unwrap();
        assert_eq!(serde_json::from_str::<Request>(&json).unwrap(), setup(Some(nic)));
    }

    /// A Setup that asks for a userland says so, and one that does not is
    /// the shape agents before it parse.
    #[test]
    fn setup_names_a_userland_only_when_it_asks_for_one() {
        let old = r#"{"type":"setup","workspace":"/w","hostname":"h","clock_unix_ns":1,"proxy_port":null,"delta":true}"#;
        match serde_json::from_str::<Request>(old).unwrap() {
            Request::Setup { userland, .. } => assert!(!userland),
            other => panic!("{other:?}"),
        }
        let asked = Request::Setup {
            workspace: "/w".into(),
            hostname: "h".into(),
            clock_unix_ns: 1,
            proxy_port: None,
            delta: true,
            interface: None,
            shares: Vec::new(),
            userland: true,
        };
        let json = serde_json::to_value(&asked).unwrap();
        assert_eq!(json["userland"], true, "{json}");
        assert_eq!(serde_json::from_value::<Request>(json).unwrap(), asked);
    }

    fn exec(terminal: Option<TerminalSize>) -> Request {
        Request::Exec {
            id: 2,
            argv: vec!["sh".into()],
            env: Vec::new(),
            cwd: "/".into(),
            root: None,
            output: None,
            terminal,
            confinement: None,
        }
    }

    /// An instruction survives its trip; a confinement without a filter
    /// has no `seccomp` key, so an agent before filters still parses it.
    #[test]
    fn seccomp_programs_travel_intact_and_only_when_asked_for() {
        let insn = (0x15, 3, 250, 0xc000_003e);
        assert_eq!(Seccomp::unpack(Seccomp::pack(insn.0, insn.1, insn.2, insn.3)), insn);
        let json = serde_json::to_value(Confinement::default()).expect("serializes");
        assert!(json.get("seccomp").is_none(), "{json}");
        let filtered = Confinement {
            seccomp: Some(Seccomp { programs: vec![vec![Seccomp::pack(6, 0, 0, 0x7fff_0000)]], flags: 1 }),
            ..Confinement::default()
        };
        let back: Confinement =
            serde_json::from_value(serde_json::to_value(&filtered).expect("serializes")).expect("parses");
        assert_eq!(back, filtered);
    }

    #[test]
    fn an_exec_without_a_terminal_is_what_an_older_agent_parses() {
        let json = serde_json::to_value(exec(None)).expect("serializes");
        assert!(json.get("terminal").is_none(), "no terminal key: {json}");
        // The shape an agent without terminals accepted (deny_unknown_fields).
        let old = serde_json::json!({"type": "exec", "id": 2, "argv": ["sh"], "env": [], "cwd": "/",
                                     "root": null, "output": null});
        assert_eq!(json, old);
        let sized = exec(Some(TerminalSize { rows: 24, cols: 80 }));
        let back: Request =
            serde_json::from_value(serde_json::to_value(&sized).expect("serializes")).expect("parses");
        assert_eq!(back, sized);
    }

    #[test]
    fn a_guest_containers_name_is_one_plain_component() {
        let group = |name: &str| GuestContainer {
            name: name.into(),
            memory_max: Some(1 << 20),
            start: true,
            ..Default::default()
        };
        assert!(group("9f86d081884c7d65-c2").name_is_plain());
        assert_eq!(group("c2").cgroup(), "/pod-c2");
        for hostile in ["", ".", "..", "../x", "a/b", "a\nb", &"x".repeat(GuestContainer::MAX_NAME + 1)] {
            assert!(!group(hostile).name_is_plain(), "{hostile:?}");
        }
    }
}
