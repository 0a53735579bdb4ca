//! An upgrade through `endpoints/{port}`: a WebSocket handshake reaches a
//! service in the guest, the service's 101 (with its
//! `Sec-WebSocket-Accept`) reaches the client, and then bytes flow both
//! ways over the one connection. A service that declines keeps its answer;
//! one that switches unasked is a 502; without the sandbox's token nothing
//! is relayed.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::json;

use super::{stdout_of, Daemon};

/// A WebSocket service for the `python` image's python3: the RFC 6455 handshake,
/// then every byte it reads is sent back upper-cased (so the answer proves
/// the guest saw the bytes). Anything but `Upgrade: websocket` gets 426.
const SERVICE: &str = r#"
import base64, hashlib, socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8765))
s.listen(8)
while True:
    c, _ = s.accept()
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = c.recv(4096)
        if not chunk:
            break
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    h = {k.strip().lower(): v.strip() for k, v in (l.split(":", 1) for l in lines[1:] if ":" in l)}
    if lines[0].split()[1].endswith("/unasked"):
        c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
        c.close()
        continue
    if h.get("upgrade", "").lower() != "websocket":
        c.sendall(b"HTTP/1.1 426 Upgrade Required\r\ncontent-length: 8\r\nconnection: close\r\n\r\ndeclined")
        c.close()
        continue
    key = h["sec-websocket-key"] + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
    accept = base64.b64encode(hashlib.sha1(key.encode()).digest()).decode()
    c.sendall(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               "Sec-WebSocket-Accept: " + accept + "\r\n\r\n").encode())
    buf = rest
    while True:
        if buf:
            c.sendall(buf.upper())
        buf = c.recv(4096)
        if not buf:
            break
    c.close()
"#;

/// Sends `request` to the daemon; returns the open connection and the
/// response head.
fn ask(addr: &str, request: &str) -> (TcpStream, String) {
    let mut conn = TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    conn.write_all(request.as_bytes()).unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match conn.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    (conn, String::from_utf8_lossy(&head).into_owned())
}

#[test]
fn a_websocket_reaches_a_service_in_the_sandbox_and_carries_bytes_both_ways() {
    let daemon = Daemon::new();
    let id = daemon.create(json!({ "image": { "uri": "python" } }));
    daemon.wait_state(&id, "Running", &["Pending"]);
    let script = SERVICE.replace('\'', "'\\''");
    let started = daemon.run(&id, &format!("printf '%s' '{script}' > /tmp/ws.py && (setsid python3 /tmp/ws.py > /tmp/ws.log 2>&1 &) && echo started"));
    assert_eq!(stdout_of(&started).trim(), "started", "{started}");
    let (code, ep) = daemon.curl("GET", &format!("/v1/sandboxes/{id}/endpoints/8765"), None);
    assert_eq!(code, 200, "{ep}");
    let endpoint = ep["endpoint"].as_str().unwrap();
    let (addr, prefix) = endpoint.split_once('/').unwrap();
    let token = ep["headers"]["X-EXECD-ACCESS-TOKEN"].as_str().unwrap();
    let handshake = |protocol: &str, token: &str| {
        format!(
            "GET /{prefix}/chat HTTP/1.1\r\nHost: {addr}\r\nUpgrade: {protocol}\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
             X-EXECD-ACCESS-TOKEN: {token}\r\n\r\n"
        )
    };

    // The service may take a while to listen: Python's first start in a
    // TCG guest on a loaded host is slow, so a deadline, not a try count.
    let mut answer = None;
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while std::time::Instant::now() < deadline {
        let (conn, head) = ask(addr, &handshake("websocket", token));
        if head.starts_with("HTTP/1.1 101") {
            answer = Some((conn, head));
            break;
        }
        assert!(head.contains(" 502 "), "{head}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let Some((mut conn, head)) = answer else {
        let log = daemon.run(&id, "cat /tmp/ws.log /tmp/ws.py | head -20; ps");
        let (_, last) = ask(addr, &handshake("websocket", token));
        panic!("the service never answered 101: {last}\n{}", stdout_of(&log));
    };
    // RFC 6455's example key and the accept it derives: computed by the
    // service in the guest, passed on unchanged.
    assert!(head.contains("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="), "{head}");
    assert!(head.to_ascii_lowercase().contains("upgrade: websocket"), "{head}");
    for message in ["hello through the relay\n", "and a second message\n"] {
        conn.write_all(message.as_bytes()).unwrap();
        let mut back = vec![0u8; message.len()];
        conn.read_exact(&mut back).unwrap();
        assert_eq!(String::from_utf8_lossy(&back), message.to_uppercase());
    }
    drop(conn);

    // A service that declines the upgrade keeps its answer; no token, no relay.
    let (_, declined) = ask(addr, &handshake("h2c", token));
    assert!(declined.starts_with("HTTP/1.1 426"), "{declined}");
    let (_, refused) = ask(addr, &handshake("websocket", "wrong-token"));
    assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");
    // A service that switches protocols unasked (a plain GET) is a bad
    // gateway, not a 101 the client never asked for.
    let plain =
        format!("GET /{prefix}/unasked HTTP/1.1\r\nHost: {addr}\r\nX-EXECD-ACCESS-TOKEN: {token}\r\n\r\n");
    let (_, unasked) = ask(addr, &plain);
    assert!(unasked.starts_with("HTTP/1.1 502"), "{unasked}");
    // The sandbox still serves after the relay closed.
    let after = daemon.run(&id, "echo alive");
    assert_eq!(stdout_of(&after).trim(), "alive", "{after}");
}
