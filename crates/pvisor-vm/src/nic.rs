//! A VM's NIC in a network namespace pvisor did not make (a Kubernetes
//! pod's, set up by CNI): the namespace's one interface is handed to the
//! guest, as Kata Containers' `tcfilter` model does. In the namespace a TAP
//! is created, and tc redirects every frame arriving on the interface to the
//! TAP and every frame from the TAP out of the interface; QEMU gets the TAP's
//! descriptor, and the guest's NIC takes the interface's MAC, address, MTU
//! and default route. So the pod's address is the VM's, the namespace's own
//! stack sees none of its traffic, and what CNI and Kubernetes' network
//! policy decide applies unchanged.
//!
//! The TAP is not persistent: it exists while QEMU holds its descriptor, so
//! a VM that ends (or is suspended) leaves nothing in the namespace but the
//! interface's ingress filter (the TAP's go with it), which a later VM
//! replaces. Frames from the guest go out
//! only with the pod's MAC and address ([`outbound_filters`]), so a guest
//! cannot pass for another pod. The namespace's interface,
//! addresses and routes are read with iproute2's `ip -j` and the filters set
//! with `tc` (run inside the namespace): the node's own tools, whose netlink
//! encoding of tc filters is not worth writing again. Nothing here runs in
//! the guest.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;

/// The TAP's name in the namespace (at most 15 bytes).
pub(crate) const TAP: &str = "pvisor-tap0";
/// The ingress filters' preference, so a later VM replaces exactly them.
const PREF: &str = "49152";
/// How long one `ip` or `tc` call may take.
const TOOL_TIMEOUT: &str = "10s";

/// The namespace's interface as the guest takes it over, and the TAP.
#[derive(Debug)]
pub(crate) struct Nic {
    /// The interface the guest stands in for (`eth0`).
    pub(crate) interface: String,
    pub(crate) mac: String,
    pub(crate) config: pvisor_agent_proto::Interface,
    /// The TAP's descriptor, for QEMU's `-netdev tap,fd=`.
    pub(crate) tap: OwnedFd,
}

#[derive(Debug, Deserialize)]
struct Link {
    ifname: String,
    #[serde(default)]
    address: String,
    #[serde(default)]
    mtu: u32,
    #[serde(default)]
    link_type: String,
    #[serde(default)]
    addr_info: Vec<Address>,
}

#[derive(Debug, Deserialize)]
struct Address {
    family: String,
    local: String,
    prefixlen: u8,
    #[serde(default)]
    scope: String,
}

#[derive(Deserialize)]
struct Route {
    #[serde(default)]
    gateway: Option<String>,
    #[serde(default)]
    dev: Option<String>,
}

/// Why the VM's NIC could not take over a network namespace's interface.
#[derive(Debug, thiserror::Error)]
pub enum NicError {
    #[error("cannot open the network namespace {}: {source}", path.display())]
    Open { path: PathBuf, source: io::Error },
    #[error("{} is not a namespace file (a path like /var/run/netns/NAME)", .0.display())]
    NotNamespace(PathBuf),
    #[error("{} is a namespace, but not a network namespace", .0.display())]
    NotNetwork(PathBuf),
    #[error("cannot stat {}: {source}", path.display())]
    Stat { path: PathBuf, source: io::Error },
    #[error("{} is the host's network namespace: a VM cannot take over the host's network", .0.display())]
    Host(PathBuf),
    /// `ip -j` printed what does not parse.
    #[error("cannot read `{command}` in {}: {source}", netns.display())]
    Parse { command: &'static str, netns: PathBuf, source: serde_json::Error },
    #[error("{interface} in {} has no usable MAC ({mac:?})", netns.display())]
    NoMac { interface: String, netns: PathBuf, mac: String },
    #[error("the network namespace {} is already joined by another VM (one container's VM per pod takes the pod's network)", .0.display())]
    Busy(PathBuf),
    #[error("cannot create the TAP {TAP} in {}: {source}{}", netns.display(), if *.no_tun { " (is the tun module loaded? modprobe tun)" } else { "" })]
    Tap { netns: PathBuf, source: io::Error, no_tun: bool },
    #[error("{0} is not a MAC")]
    BadMac(String),
    #[error("{0} is not an IPv4 address")]
    BadAddress(String),
    /// The namespace has no one interface a VM can take over.
    #[error("the network namespace {} {problem}", netns.display())]
    Interfaces { netns: PathBuf, problem: String },
    #[error("timeout not found: the pod network needs coreutils on the node")]
    NoTimeout,
    #[error("cannot run {program} in the network namespace: {source}")]
    Run { program: String, source: io::Error },
    #[error("{command} did not finish within {TOOL_TIMEOUT} in the pod's network namespace")]
    TimedOut { command: String },
    #[error("{0} not found: the pod network needs iproute2 on the node")]
    NoTool(String),
    #[error("{command} failed in the pod's network namespace: {stderr}")]
    Failed { command: String, stderr: String },
}

/// Joins the network namespace at `netns`: finds its interface, creates the
/// TAP and redirects the interface's traffic through it.
pub(crate) fn join(netns: &Path) -> Result<Nic, NicError> {
    // Checked again on the descriptor used: the path may have changed
    // since admission, and a resume is not admitted anew.
    let ns = open_network_namespace(netns)?;
    let parse = |command| move |source| NicError::Parse { command, netns: netns.to_owned(), source };
    let links: Vec<Link> = serde_json::from_slice(&run_in(&ns, "ip", &["-j", "addr", "show"])?)
        .map_err(parse("ip -j addr show"))?;
    let (link, address) = pick(&links, netns)?;
    if !is_mac(&link.address) {
        return Err(NicError::NoMac {
            interface: link.ifname.clone(),
            netns: netns.to_owned(),
            mac: link.address.clone(),
        });
    }
    let routes: Vec<Route> =
        serde_json::from_slice(&run_in(&ns, "ip", &["-j", "-4", "route", "show", "default"])?)
            .map_err(parse("ip -j route show default"))?;
    let gateway = routes.into_iter().find(|r| r.dev.as_deref() == Some(&link.ifname)).and_then(|r| r.gateway);
    let tap = create_tap(&ns).map_err(|source| match source.raw_os_error() {
        Some(libc::EBUSY) => NicError::Busy(netns.to_owned()),
        errno => NicError::Tap {
            netns: netns.to_owned(),
            no_tun: matches!(errno, Some(libc::ENOENT) | Some(libc::ENODEV)),
            source,
        },
    })?;
    let mtu = if link.mtu == 0 { 1500 } else { link.mtu };
    let mtu_arg = mtu.to_string();
    run_in(&ns, "ip", &["link", "set", TAP, "mtu", &mtu_arg, "up"])?;
    let ip = address.split('/').next().unwrap_or_default();
    for (from, filters) in [
        (link.ifname.as_str(), inbound_filters(TAP)),
        (TAP, outbound_filters(&link.address, ip, &link.ifname)?),
    ] {
        run_in(&ns, "tc", &["qdisc", "replace", "dev", from, "ingress"])?;
        for (pref, rule) in filters {
            // A filter a previous VM left is replaced, not stacked.
            delete_filter(&ns, from, pref)?;
            let mut args = vec!["filter", "add", "dev", from, "ingress", "pref", pref];
            args.extend(rule.iter().map(String::as_str));
            match run_in(&ns, "tc", &args) {
                // A kernel without act_gact cannot drop in tc; the TAP's
                // sysctls ([`contain_tap`]) already discard what is left.
                Err(NicError::Failed { stderr, .. })
                    if pref == PREF && from == TAP && stderr.contains("Failed to load TC action module") =>
                {
                    tracing::debug!("no tc drop action (act_gact) in this kernel; the TAP's sysctls discard the guest's other frames")
                }
                other => drop(other?),
            }
        }
    }
    Ok(Nic {
        interface: link.ifname.clone(),
        mac: link.address.clone(),
        config: pvisor_agent_proto::Interface { mac: link.address.clone(), address, gateway, mtu },
        tap,
    })
}

/// The preferences of the guest's outbound filters: its IPv4 packets and
/// its ARP, each only from its own MAC and address, go out; the rest of
/// what it sends is dropped by the last one, [`PREF`].
const PREF_IPV4: &str = "49150";
const PREF_ARP: &str = "49151";

/// A tc rule: what follows `tc filter add dev DEV ingress pref PREF`.
type Rule = Vec<String>;

fn rule(words: &[&str]) -> Rule {
    words.iter().map(|w| (*w).to_owned()).collect()
}

/// Frames arriving on the namespace's interface all go to the guest. u32
/// with an empty match is every frame (Kata's filter; cls_matchall is not
/// in every kernel).
fn inbound_filters(tap: &str) -> Vec<(&'static str, Rule)> {
    let every = ["protocol", "all", "u32", "match", "u8", "0", "0"];
    let redirect = ["action", "mirred", "egress", "redirect", "dev", tap];
    vec![(PREF, rule(&[&every[..], &redirect[..]].concat()))]
}

/// Frames from the guest go out only if they are the pod's: IPv4 from the
/// pod's MAC and address, ARP whose Ethernet source and sender are the
/// pod's MAC and address; everything else the guest sends (root in its VM,
/// it can set any address) is dropped, so it cannot pass for another pod.
/// The drop is the last filter's where the kernel has act_gact; either way
/// a frame no filter redirects meets the namespace's own stack through the
/// TAP, which [`contain_tap`] makes discard it.
/// u32 offsets are from the network header: the Ethernet source is at -8
/// (4 bytes) and -4 (2), ARP's sender MAC at 8 and 12, its sender address
/// at 14 (two 16-bit halves: u32 keys must be aligned).
fn outbound_filters(mac: &str, ip: &str, interface: &str) -> Result<Vec<(&'static str, Rule)>, NicError> {
    let bytes: Vec<u8> = mac
        .split(':')
        .map(|b| u8::from_str_radix(b, 16))
        .collect::<Result<_, _>>()
        .map_err(|_| NicError::BadMac(mac.to_owned()))?;
    let address: std::net::Ipv4Addr = ip.parse().map_err(|_| NicError::BadAddress(ip.to_owned()))?;
    let [a, b, c, d] = address.octets();
    let mac_hi = format!("0x{:02x}{:02x}{:02x}{:02x}", bytes[0], bytes[1], bytes[2], bytes[3]);
    let mac_lo = format!("0x{:02x}{:02x}", bytes[4], bytes[5]);
    let (ip_hi, ip_lo) = (format!("0x{a:02x}{b:02x}"), format!("0x{c:02x}{d:02x}"));
    let from_mac = |at_hi: &str, at_lo: &str| -> Vec<String> {
        rule(&[
            "match",
            "u32",
            &mac_hi,
            "0xffffffff",
            "at",
            at_hi,
            "match",
            "u16",
            &mac_lo,
            "0xffff",
            "at",
            at_lo,
        ])
    };
    let redirect = rule(&["action", "mirred", "egress", "redirect", "dev", interface]);
    let source = format!("{address}/32");
    let ipv4 = [
        rule(&["protocol", "ip", "u32", "match", "ip", "src", &source]),
        from_mac("-8", "-4"),
        redirect.clone(),
    ]
    .concat();
    let arp = [
        rule(&["protocol", "arp", "u32"]),
        from_mac("-8", "-4"),
        from_mac("8", "12"),
        rule(&["match", "u16", &ip_hi, "0xffff", "at", "14", "match", "u16", &ip_lo, "0xffff", "at", "16"]),
        redirect,
    ]
    .concat();
    let rest = rule(&["protocol", "all", "u32", "match", "u8", "0", "0", "action", "drop"]);
    Ok(vec![(PREF_IPV4, ipv4), (PREF_ARP, arp), (PREF, rest)])
}

/// Deletes the ingress filter `pref` of `dev`; one that is not there is
/// no error, anything else is.
fn delete_filter(ns: &File, dev: &str, pref: &str) -> Result<(), NicError> {
    match run_in(ns, "tc", &["filter", "del", "dev", dev, "ingress", "pref", pref]) {
        Ok(_) => Ok(()),
        Err(NicError::Failed { stderr, .. })
            if stderr.contains("No such file")
                || stderr.contains("not found")
                || stderr.contains("Cannot find") =>
        {
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Opens `path` if it is a network namespace other than the host's (the
/// one of pid 1 or of this process): a VM's NIC redirects all of the
/// namespace's traffic, which on the host's own would take the node's
/// network. The caller keeps the descriptor, so the check holds for it.
pub fn open_network_namespace(path: &Path) -> Result<File, NicError> {
    let ns = File::open(path).map_err(|source| NicError::Open { path: path.to_owned(), source })?;
    // SAFETY: NS_GET_NSTYPE takes no argument and returns the namespace's
    // CLONE_NEW* type, or fails with ENOTTY on a file that is not one. The
    // ioctl is libc's: rustix has no namespace ioctls.
    let kind = unsafe { libc::ioctl(ns.as_raw_fd(), NS_GET_NSTYPE) };
    if kind < 0 {
        return Err(NicError::NotNamespace(path.to_owned()));
    }
    if kind != libc::CLONE_NEWNET {
        return Err(NicError::NotNetwork(path.to_owned()));
    }
    let id = |f: &File| {
        f.metadata()
            .map(|m| (std::os::unix::fs::MetadataExt::dev(&m), std::os::unix::fs::MetadataExt::ino(&m)))
    };
    let this = id(&ns).map_err(|source| NicError::Stat { path: path.to_owned(), source })?;
    for host in ["/proc/1/ns/net", "/proc/self/ns/net"] {
        if File::open(host).and_then(|f| id(&f)).is_ok_and(|h| h == this) {
            return Err(NicError::Host(path.to_owned()));
        }
    }
    Ok(ns)
}

/// `NS_GET_NSTYPE`, `_IO(0xb7, 0x3)` (linux/nsfs.h).
const NS_GET_NSTYPE: libc::c_ulong = 0xb703;

/// `aa:bb:cc:dd:ee:ff`: what QEMU's `mac=` takes, and nothing else.
fn is_mac(mac: &str) -> bool {
    mac.len() == 17
        && mac.split(':').count() == 6
        && mac.split(':').all(|b| b.len() == 2 && b.bytes().all(|c| c.is_ascii_hexdigit()))
}

/// The namespace's one Ethernet interface with a global IPv4 address, and
/// that address as `ADDRESS/PREFIX`.
fn pick<'a>(links: &'a [Link], netns: &Path) -> Result<(&'a Link, String), NicError> {
    let problem = |problem: String| NicError::Interfaces { netns: netns.to_owned(), problem };
    let candidates: Vec<&Link> = links
        .iter()
        .filter(|l| l.ifname != TAP && l.link_type == "ether")
        .filter(|l| l.addr_info.iter().any(|a| a.family == "inet" && a.scope == "global"))
        .collect();
    let link = match candidates.as_slice() {
        [one] => *one,
        [] if links.iter().any(|l| {
            l.link_type == "ether" && l.addr_info.iter().any(|a| a.family == "inet6" && a.scope == "global")
        }) =>
        {
            return Err(problem("has only IPv6 addresses; the VM's NIC is configured for IPv4 only".into()))
        }
        [] => {
            return Err(problem("has no Ethernet interface with an IPv4 address (did CNI set it up?)".into()))
        }
        many => {
            return Err(problem(format!(
                "has {} interfaces with IPv4 addresses ({}); a VM takes over exactly one",
                many.len(),
                many.iter().map(|l| l.ifname.as_str()).collect::<Vec<_>>().join(", ")
            )))
        }
    };
    let address = link
        .addr_info
        .iter()
        .find(|a| a.family == "inet" && a.scope == "global")
        .map(|a| format!("{}/{}", a.local, a.prefixlen))
        .unwrap_or_default();
    Ok((link, address))
}

/// Runs `program args` inside the namespace `ns`; its stdout, or an error
/// with its stderr.
fn run_in(ns: &File, program: &str, args: &[&str]) -> Result<Vec<u8>, NicError> {
    let raw = ns.as_raw_fd();
    // Under coreutils' `timeout`: a wedged `ip` or `tc` (a netlink socket
    // that never answers) must fail the VM's start, not hang it.
    let mut command = Command::new("timeout");
    command.args(["--kill-after=2", TOOL_TIMEOUT, program]).args(args);
    // SAFETY: only setns runs between fork and exec, a bare syscall on a
    // descriptor the child inherited.
    unsafe {
        command.pre_exec(move || {
            let fd = std::os::fd::BorrowedFd::borrow_raw(raw);
            rustix::thread::move_into_link_name_space(fd, Some(rustix::thread::LinkNameSpaceType::Network))
                .map_err(|e| {
                    io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        format!("cannot enter the namespace: {e}"),
                    )
                })
        });
    }
    let out = command.output().map_err(|source| match source.kind() {
        io::ErrorKind::NotFound => NicError::NoTimeout,
        _ => NicError::Run { program: program.to_owned(), source },
    })?;
    let command = || format!("{program} {}", args.join(" "));
    match out.status.code() {
        Some(124) | Some(137) => return Err(NicError::TimedOut { command: command() }),
        Some(127) => return Err(NicError::NoTool(program.to_owned())),
        _ => {}
    }
    if !out.status.success() {
        return Err(NicError::Failed {
            command: command(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(out.stdout)
}

/// Opens `/dev/net/tun` from a thread inside the namespace (a TAP lives in
/// the namespace of the thread that opened the device) and makes it [`TAP`].
fn create_tap(ns: &File) -> io::Result<OwnedFd> {
    let ns = ns.try_clone()?;
    // A thread of its own: it enters the namespace and ends.
    std::thread::Builder::new()
        .name("pvisor-vm-tap".into())
        .spawn(move || -> io::Result<OwnedFd> {
            rustix::thread::move_into_link_name_space(
                ns.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )?;
            let tun = OwnedFd::from(std::fs::OpenOptions::new().read(true).write(true).open("/dev/net/tun")?);
            // SAFETY: ifreq is plain data; TUNSETIFF reads its name and flags.
            // The ioctl is libc's: rustix has no TUN calls.
            unsafe {
                let mut req: libc::ifreq = std::mem::zeroed();
                for (dst, src) in req.ifr_name.iter_mut().zip(TAP.bytes()) {
                    *dst = src as libc::c_char;
                }
                req.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short;
                if libc::ioctl(tun.as_raw_fd(), libc::TUNSETIFF, &req) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            contain_tap()?;
            Ok(tun)
        })?
        .join()
        .map_err(|_| io::Error::other("the TAP thread panicked"))?
}

/// Makes the namespace's own stack discard whatever the guest sends that
/// no filter redirected out (a spoofed address or MAC, IPv6, other
/// protocols), from a thread inside the namespace (`/proc/sys/net` is the
/// calling thread's namespace's): IPv4 from any source not routed through
/// the TAP fails the strict reverse-path check, none is forwarded, no ARP
/// is answered on it, and IPv6 is off on it.
#[allow(clippy::disallowed_methods)] // sysctl files, not records
fn contain_tap() -> io::Result<()> {
    let conf = |family: &str, key: &str| format!("/proc/sys/net/{family}/conf/{TAP}/{key}");
    for (path, value) in [
        (conf("ipv4", "rp_filter"), "1"),
        (conf("ipv4", "forwarding"), "0"),
        (conf("ipv4", "arp_ignore"), "8"),
    ] {
        std::fs::write(&path, value).map_err(|e| io::Error::new(e.kind(), format!("writing {path}: {e}")))?;
    }
    // A namespace without IPv6 has no such file, and nothing to turn off.
    match std::fs::write(conf("ipv6", "disable_ipv6"), "1") {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::{pick, Link};
    use std::path::Path;

    /// `ip -j addr show` in a pod's namespace, as CNI's bridge plugin
    /// leaves it (trimmed): loopback, and eth0 with one IPv4 address.
    const POD: &str = r#"[
      {"ifindex":1,"ifname":"lo","mtu":65536,"link_type":"loopback","address":"00:00:00:00:00:00",
       "addr_info":[{"family":"inet","local":"127.0.0.1","prefixlen":8,"scope":"host"}]},
      {"ifindex":2,"link_index":5,"ifname":"eth0","mtu":1450,"link_type":"ether","address":"66:96:de:a5:1a:58",
       "addr_info":[{"family":"inet","local":"10.88.0.7","prefixlen":16,"scope":"global"},
                    {"family":"inet6","local":"fe80::6496:deff:fea5:1a58","prefixlen":64,"scope":"link"}]}
    ]"#;

    #[test]
    fn the_pods_interface_is_the_one_ethernet_link_with_an_ipv4_address() {
        let links: Vec<Link> = serde_json::from_str(POD).unwrap();
        let (link, address) = pick(&links, Path::new("/run/netns/x")).unwrap();
        assert!(super::is_mac(&link.address));
        assert_eq!(
            (link.ifname.as_str(), link.address.as_str(), link.mtu),
            ("eth0", "66:96:de:a5:1a:58", 1450)
        );
        assert_eq!(address, "10.88.0.7/16");
    }

    /// The guest's frames go out only as the pod's: IPv4 from its address
    /// and MAC, ARP from its MAC naming it as sender, and the rest dropped
    /// last.
    #[test]
    fn the_guests_frames_leave_only_with_the_pods_mac_and_address() {
        let filters = super::outbound_filters("66:96:de:a5:1a:58", "10.88.0.7", "eth0").unwrap();
        let words: Vec<(&str, String)> = filters.iter().map(|(p, r)| (*p, r.join(" "))).collect();
        let mac = "match u32 0x6696dea5 0xffffffff at -8 match u16 0x1a58 0xffff at -4";
        assert_eq!(words[0].0, "49150");
        assert_eq!(
            words[0].1,
            format!("protocol ip u32 match ip src 10.88.0.7/32 {mac} action mirred egress redirect dev eth0")
        );
        assert_eq!(words[1].0, "49151");
        assert_eq!(
            words[1].1,
            format!(
                "protocol arp u32 {mac} match u32 0x6696dea5 0xffffffff at 8 match u16 0x1a58 0xffff at 12 \
                 match u16 0x0a58 0xffff at 14 match u16 0x0007 0xffff at 16 action mirred egress redirect dev eth0"
            )
        );
        assert_eq!(words[2], (super::PREF, "protocol all u32 match u8 0 0 action drop".to_owned()));
        assert!(super::outbound_filters("66:96:de:a5:1a:58", "fe80::1", "eth0").is_err());
    }

    #[test]
    fn only_a_plain_mac_reaches_qemus_command_line() {
        assert!(super::is_mac("66:96:de:a5:1a:58"));
        for bad in ["", "66:96:de:a5:1a", "66:96:de:a5:1a:58,romfile=/x", "gg:96:de:a5:1a:58"] {
            assert!(!super::is_mac(bad), "{bad}");
        }
    }

    /// The host's own namespace, and a namespace of another kind, are refused.
    #[test]
    fn the_hosts_network_namespace_is_never_joined() {
        let e = super::open_network_namespace(Path::new("/proc/self/ns/net")).unwrap_err().to_string();
        assert!(e.contains("the host's network namespace"), "{e}");
        let e = super::open_network_namespace(Path::new("/proc/self/ns/mnt")).unwrap_err().to_string();
        assert!(e.contains("not a network namespace"), "{e}");
        let e = super::open_network_namespace(Path::new("/etc/hostname")).unwrap_err().to_string();
        assert!(e.contains("not a namespace file"), "{e}");
    }

    #[test]
    fn none_or_two_candidates_are_refused_by_name() {
        let links = || -> Vec<Link> { serde_json::from_str(POD).unwrap() };
        let only_lo: Vec<Link> = links().into_iter().take(1).collect();
        assert!(pick(&only_lo, Path::new("/run/netns/x"))
            .unwrap_err()
            .to_string()
            .contains("did CNI set it up"));
        let mut two = links();
        let mut eth1 = links().remove(1);
        eth1.ifname = "eth1".into();
        two.push(eth1);
        let e = pick(&two, Path::new("/run/netns/x")).unwrap_err().to_string();
        assert!(e.contains("2 interfaces") && e.contains("eth0, eth1"), "{e}");
    }

    /// The TAP error names the tun module only when the device is missing.
    #[test]
    fn a_missing_tun_device_is_named() {
        let tap = |no_tun| super::NicError::Tap {
            netns: "/run/netns/x".into(),
            source: std::io::Error::from_raw_os_error(libc::ENODEV),
            no_tun,
        };
        let with = tap(true).to_string();
        assert!(
            with.starts_with("cannot create the TAP ")
                && with.ends_with(" (is the tun module loaded? modprobe tun)"),
            "{with}"
        );
        assert!(!tap(false).to_string().contains("modprobe"));
    }
}
