//! The agent link against a hostile guest: the real reader, the test
//! playing the guest on a socket pair.

use super::*;

/// A reader on one end of a socket pair, the test playing a hostile
/// guest on the other; the agent channel's peer never reads (a frozen
/// agent), so anything written to the guest waits.
struct Rig {
    guest: UnixStream,
    replies: Receiver<Answer>,
    events: Receiver<AgentEvent>,
    calls: Arc<Calls>,
    sinks: Sinks,
    net: NetBridge,
    reader: std::thread::JoinHandle<()>,
    _frozen: UnixStream,
}

fn rig(holding: bool) -> Rig {
    let (host, guest) = UnixStream::pair().unwrap();
    let (agent, frozen) = UnixStream::pair().unwrap();
    let agent = Arc::new(Mutex::new(agent));
    let (replies_tx, replies) = mpsc::sync_channel(64);
    let (events_tx, events) = mpsc::channel();
    let credits = Arc::new(Credits::default());
    let net = NetBridge::new(None, credits.clone(), &agent).unwrap();
    let (calls, sinks) = (Arc::new(Calls::default()), Sinks::default());
    sinks.lock().unwrap().holding = holding;
    let reader = std::thread::spawn({
        let (calls, sinks, net) = (calls.clone(), sinks.clone(), net.clone());
        move || read_agent(host, replies_tx, calls, events_tx, net, agent, credits, sinks)
    });
    Rig { guest, replies, events, calls, sinks, net, reader, _frozen: frozen }
}

fn send(rig: &mut Rig, answers: Option<u64>, reply: &Reply, payload: &[u8]) {
    write_tagged(&mut rig.guest, ANSWERS, answers, reply, payload).unwrap();
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// 16,000 proxy connections the host cannot take (no proxy), from a
/// guest whose agent never reads: the host's threads stay as they were
/// and the reader keeps reading (the exit still arrives).
#[test]
fn a_netopen_flood_costs_no_thread_per_frame() {
    let mut rig = rig(false);
    let before = threads();
    for stream in 0..16_000 {
        send(&mut rig, None, &Reply::NetOpen { stream }, b"");
    }
    send(&mut rig, None, &Reply::Exited { id: EXEC_ID, code: Some(3), signal: None }, b"");
    match rig.events.recv_timeout(Duration::from_secs(20)).unwrap() {
        AgentEvent::Exited { code, .. } => assert_eq!(code, Some(3)),
        other => panic!("{other:?}"),
    }
    let after = threads();
    // Other tests run beside this one: the bound is loose, the attack made 12,000.
    assert!(after < before + 32, "{before} threads before the flood, {after} after");
    assert!(rig.net.unrefused.load(Ordering::Relaxed) > 0, "the refusal queue never filled");
}

/// Output for execs this supervisor never started: a booted guest's is
/// dropped; a restored guest's is held within its caps.
#[test]
fn output_for_unknown_execs_is_bounded() {
    let chunk = vec![b'x'; 1 << 20];
    for holding in [false, true] {
        let mut rig = rig(holding);
        for id in 2..1_202 {
            send(&mut rig, None, &Reply::Stdout { id }, &chunk);
        }
        send(&mut rig, None, &Reply::Exited { id: EXEC_ID, code: Some(0), signal: None }, b"");
        assert!(matches!(
            rig.events.recv_timeout(Duration::from_secs(60)).unwrap(),
            AgentEvent::Exited { .. }
        ));
        let relays = rig.sinks.lock().unwrap();
        let held: usize = relays.held.values().map(|h| h.bytes).sum();
        assert_eq!(held, relays.held_bytes);
        if holding {
            assert!(held <= HELD_TOTAL && relays.held.len() <= MAX_HELD_EXECS, "{held} bytes held");
            assert!(held > 0);
        } else {
            assert_eq!((held, relays.held.len()), (0, 0));
        }
        assert!(relays.unheld >= 1_184 << 20, "{} bytes dropped", relays.unheld);
    }
}

/// Replies nobody asked for never reach a call, never block the reader,
/// and past the limit cut the agent off; a stale reply naming an
/// earlier request is not the answer to a later one.
#[test]
fn an_answer_longer_than_the_queue_arrives_whole_while_its_caller_drains_it() {
    // An export answers one call with a frame per 64 KiB staged: a
    // caller slower than the guest (a loaded host writing the stage)
    // is backpressure, and no frame may be dropped for it.
    let mut rig = rig(false);
    let call = rig.calls.start();
    let frames = 1000u32;
    let guest = std::thread::spawn({
        let mut guest = rig.guest.try_clone().unwrap();
        move || {
            for n in 0..frames {
                write_tagged(&mut guest, ANSWERS, Some(call), &Reply::Data, &n.to_le_bytes()).unwrap();
            }
        }
    });
    for n in 0..frames {
        if n % 100 == 0 {
            std::thread::sleep(Duration::from_millis(50));
        }
        let (id, reply, bytes) = rig.replies.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!((id, reply, bytes), (call, Reply::Data, n.to_le_bytes().to_vec()), "frame {n}");
    }
    guest.join().unwrap();
    assert_eq!(rig.calls.unrequested.load(Ordering::SeqCst), 0);
    // Once the call is over, more frames naming it are late answers: the
    // reader drops them at once instead of waiting for room, so the
    // command's exit still gets through.
    rig.calls.end(call);
    for _ in 0..200 {
        send(&mut rig, Some(call), &Reply::Data, b"x");
    }
    send(&mut rig, None, &Reply::Exited { id: EXEC_ID, code: Some(3), signal: None }, b"");
    match rig.events.recv_timeout(Duration::from_secs(5)).unwrap() {
        AgentEvent::Exited { code, .. } => assert_eq!(code, Some(3)),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        rig.calls.unrequested.load(Ordering::SeqCst),
        0,
        "late answers are not held against the agent"
    );
}

#[test]
fn unrequested_and_stale_replies_are_dropped_then_cut_off() {
    let mut rig = rig(false);
    let first = rig.calls.start();
    let second = rig.calls.start();
    // Late answers to a call that timed out are dropped but not held
    // against the agent, however many.
    for _ in 0..2 * MAX_UNREQUESTED {
        send(&mut rig, Some(first), &Reply::Ready { steps_us: Vec::new() }, b"");
    }
    send(&mut rig, None, &Reply::Ready { steps_us: Vec::new() }, b"");
    send(&mut rig, Some(second + 5), &Reply::Ready { steps_us: Vec::new() }, b"");
    send(&mut rig, Some(second), &Reply::Done { op: "poll".into() }, b"");
    let (id, reply, _) = rig.replies.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!((id, reply), (second, Reply::Done { op: "poll".into() }));
    assert_eq!(rig.calls.unrequested.load(Ordering::SeqCst), 2, "only replies naming no request count");
    for _ in 0..MAX_UNREQUESTED {
        send(&mut rig, None, &Reply::Ready { steps_us: Vec::new() }, b"");
    }
    match rig.events.recv_timeout(Duration::from_secs(10)).unwrap() {
        AgentEvent::Gone(why) => assert!(why.contains("cut off"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(rig.replies.try_recv().is_err(), "an unrequested reply was queued");
    rig.reader.join().unwrap();
}
