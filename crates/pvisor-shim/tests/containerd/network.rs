//! A container in a pod's network namespace: its VM takes over the
//! namespace's interface, so the container has the pod's address.

use super::*;

/// A network namespace with a veth to this one, as CNI's bridge or ptp
/// plugins make a pod's: `10.233.N.2/24` inside (default route via `.1`),
/// `10.233.N.1` here. Deleted on drop.
struct Netns {
    name: String,
    host_link: String,
    subnet: u32,
}

impl Netns {
    fn create() -> Netns {
        let pid = std::process::id();
        let ns = Netns {
            name: format!("pvisor-t{pid}"),
            host_link: format!("pvh{}", pid % 100_000),
            subnet: pid % 250,
        };
        let (gw, addr) = (ns.ip(1), ns.ip(2));
        let steps: [&[&str]; 8] = [
            &["netns", "add", &ns.name],
            &["link", "add", &ns.host_link, "type", "veth", "peer", "name", "eth0", "netns", &ns.name],
            &["addr", "add", &format!("{gw}/24"), "dev", &ns.host_link],
            &["link", "set", &ns.host_link, "up"],
            &["-n", &ns.name, "addr", "add", &format!("{addr}/24"), "dev", "eth0"],
            &["-n", &ns.name, "link", "set", "eth0", "up"],
            &["-n", &ns.name, "link", "set", "lo", "up"],
            &["-n", &ns.name, "route", "add", "default", "via", &gw],
        ];
        for args in steps {
            let out = Command::new("ip").args(args).output().expect("ip runs");
            assert!(out.status.success(), "ip {}: {}", args.join(" "), text(&out.stderr));
        }
        ns
    }

    fn ip(&self, host: u32) -> String {
        format!("10.233.{}.{host}", self.subnet)
    }

    fn path(&self) -> String {
        format!("/var/run/netns/{}", self.name)
    }

    fn has_tap(&self) -> bool {
        Command::new("ip")
            .args(["-n", &self.name, "link", "show", "pvisor-tap0"])
            .output()
            .is_ok_and(|o| o.status.success())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.host_link]).output();
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
    }
}

/// The peer address of a connection `listener` accepts within `timeout`.
fn accepted_within(listener: &std::net::TcpListener, timeout: Duration) -> Option<String> {
    listener.set_nonblocking(true).expect("nonblocking");
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok((_, peer)) = listener.accept() {
            return Some(peer.to_string());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// What a connection to `addr` reads until EOF, retried while refused (a
/// server in the guest may not listen yet).
fn read_from(addr: &str, timeout: Duration) -> std::io::Result<String> {
    let deadline = Instant::now() + timeout;
    loop {
        match std::net::TcpStream::connect_timeout(&addr.parse().expect("an address"), Duration::from_secs(5))
        {
            Ok(mut conn) => {
                conn.set_read_timeout(Some(Duration::from_secs(20)))?;
                let mut got = String::new();
                std::io::Read::read_to_string(&mut conn, &mut got)?;
                return Ok(got);
            }
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(300)),
        }
    }
}

#[test]
#[ignore = "needs root, containerd and the vm guest image: scripts/test.sh runs it as root, with --include-ignored"]
fn a_container_in_a_network_namespace_has_its_address_through_the_vms_nic() {
    require();
    let c = start(NAMESPACE);
    let ns = Netns::create();
    let node = std::net::TcpListener::bind((ns.ip(1), 0)).expect("a listener on the veth");
    let port = node.local_addr().expect("its port").port();
    let script =
        format!("echo from-vm | nc -w 10 {} {port}; while :; do echo served | nc -l -p 8080; done", ns.ip(1));
    let with_ns = format!("network:{}", ns.path());
    // CAP_NET_ADMIN (not in ctr's default set): the guest may then re-address
    // its NIC, which is what the anti-spoofing below is tested against.
    c.ok(&[
        "run",
        "-d",
        "--runtime",
        RUNTIME,
        "--cap-add",
        "CAP_NET_ADMIN",
        "--with-ns",
        &with_ns,
        IMAGE,
        "netted",
        "sh",
        "-c",
        &script,
    ]);

    // Out: the guest's connection arrives from the namespace's address.
    node.set_nonblocking(false).expect("blocking");
    let (mut conn, peer) = {
        let (tx, rx) = std::sync::mpsc::channel();
        let listener = node.try_clone().expect("clone");
        std::thread::spawn(move || tx.send(listener.accept()));
        rx.recv_timeout(Duration::from_secs(120)).expect("the guest connected out").expect("accept")
    };
    let mut got = String::new();
    conn.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    std::io::Read::read_to_string(&mut conn, &mut got).expect("read");
    assert_eq!(got, "from-vm\n");
    // busybox nc half-closes at its stdin's end and exits once we close.
    drop(conn);
    assert_eq!(peer.ip().to_string(), ns.ip(2), "the VM has the namespace's address");
    // In: the namespace's address is the VM's.
    let pod = format!("{}:8080", ns.ip(2));
    assert_eq!(read_from(&pod, Duration::from_secs(60)).expect("the guest's server"), "served\n");
    // The namespace's own stack sees none of it: a server there on another
    // port is not reached (the VM, which has none there, refuses).
    let mut inside = Command::new("ip")
        .args(["netns", "exec", &ns.name, "busybox", "nc", "-l", "-p", "9090"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("a server in the namespace");
    std::thread::sleep(Duration::from_millis(500));
    let refused = std::net::TcpStream::connect_timeout(
        &format!("{}:9090", ns.ip(2)).parse().unwrap(),
        Duration::from_secs(5),
    );
    assert!(refused.is_err(), "the connection went to the namespace's stack, not the VM");
    let _ = inside.kill();
    assert!(inside.wait_with_output().expect("reaped").stdout.is_empty());

    frames_leave_only_as_the_pod(&c, &ns);
    // The Trace records the decision.
    let listed = pvisor(&c, &["jobs", "--json", "--label", "containerd.io/container=netted"]);
    let job: serde_json::Value =
        serde_json::from_str(listed.lines().next().unwrap_or_default()).expect("one Job");
    let events = pvisor(&c, &["events", "--json", job["data"]["job"].as_str().expect("its id")]);
    assert!(events.contains(r#""mode":"namespace""#) && events.contains(&ns.path()), "{events}");

    // A pause ends QEMU and with it the TAP; the resume makes a new one
    // and the guest keeps its address.
    c.ok(&["task", "pause", "netted"]);
    assert!(!ns.has_tap(), "a suspended VM holds no TAP");
    c.ok(&["task", "resume", "netted"]);
    assert_eq!(read_from(&pod, Duration::from_secs(60)).expect("served after the resume"), "served\n");

    c.ok(&["task", "kill", "-s", "KILL", "netted"]);
    eventually("the task stops", Duration::from_secs(60), || {
        c.task_status("netted").as_deref() == Some("STOPPED")
    });
    let _ = c.ctr(&["task", "delete", "netted"]);
    c.ok(&["container", "rm", "netted"]);
    eventually("the VM is gone", Duration::from_secs(30), || processes_naming(&c.home()).is_empty());
    assert!(!ns.has_tap(), "nothing is left in the namespace");
    assert!(
        read_from(&pod, Duration::from_secs(1)).is_err(),
        "nothing serves the address after the container"
    );
}

/// The guest is root in its VM and may take any address or MAC, but its
/// frames leave only as the pod's: a connection from another address, or
/// from its own address under another MAC (the node's neighbour cache
/// flushed, so it must ARP anew), never reaches the node. Back as itself,
/// it does again.
fn frames_leave_only_as_the_pod(c: &Containerd, ns: &Netns) {
    let node2 = std::net::TcpListener::bind((ns.ip(1), 0)).expect("a second listener");
    let port2 = node2.local_addr().expect("its port").port();
    let (gw, real, spoofed) = (ns.ip(1), ns.ip(2), ns.ip(50));
    // Runs `script` in the guest while the node accepts on `node2`; what
    // the node accepted within `timeout` (busybox nc waits for the node to
    // close, so the accept runs beside the exec), and what the exec printed.
    let guest = |id: &str, script: String, timeout: Duration| {
        let _ = Command::new("ip").args(["neigh", "flush", "dev", &ns.host_link]).output();
        let listener = node2.try_clone().expect("clone");
        let accepting = std::thread::spawn(move || accepted_within(&listener, timeout));
        let out = c.ctr(&["task", "exec", "--exec-id", id, "netted", "sh", "-c", &script]);
        (accepting.join().expect("the accept thread"), text(&out.stdout) + &text(&out.stderr))
    };
    let send = format!("echo $0 | nc -w 3 {gw} {port2}");
    let (accepted, ran) = guest(
        "spoof-ip",
        format!(
            "ip addr flush dev eth0 && ip addr add {spoofed}/24 dev eth0 && ip route add default via {gw} && {send}"
        ),
        Duration::from_secs(6),
    );
    assert_eq!(accepted, None, "a spoofed address got out: {ran}");
    let mac = text(
        &Command::new("ip").args(["-n", &ns.name, "-j", "link", "show", "eth0"]).output().expect("ip").stdout,
    );
    let mac: serde_json::Value = serde_json::from_str(&mac).expect("ip -j");
    let mac = mac[0]["address"].as_str().expect("the pod's MAC").to_owned();
    let relink = |address: &str| {
        format!(
            "ip addr flush dev eth0 && ip link set eth0 down && ip link set eth0 address {address} && \
             ip link set eth0 up && ip addr add {real}/24 dev eth0 && ip route add default via {gw}"
        )
    };
    let (accepted, ran) =
        guest("spoof-mac", format!("{} && {send}", relink("02:00:00:00:00:99")), Duration::from_secs(6));
    assert_eq!(accepted, None, "a spoofed MAC got out: {ran}");
    let (accepted, ran) = guest("as-itself", format!("{} && {send}", relink(&mac)), Duration::from_secs(20));
    assert_eq!(
        accepted.as_deref().and_then(|a| a.split(':').next()),
        Some(real.as_str()),
        "the pod's own frames go out: {ran}"
    );
}
