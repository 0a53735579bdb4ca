//! The SSE events execd streams (the SDK's `ServerStreamEvent`), shared by
//! commands, sessions and code contexts.

use std::time::Instant;

use hyper::body::Bytes;
use hyper::Response;
use serde_json::{json, Value};

use crate::http::{self, Body};
use crate::lines::Lines;

/// One SSE event: `data: {json}\n\n`, with the integer `timestamp` the SDK requires.
pub(crate) fn event(mut value: Value) -> Bytes {
    value["timestamp"] = json!(http::unix_ms());
    Bytes::from(format!("data: {value}\n\n"))
}

/// stdout or stderr events, one per text (see `lines.rs`).
pub(crate) fn output_events(kind: &str, texts: Vec<Vec<u8>>) -> Vec<Bytes> {
    texts.iter().map(|t| event(json!({ "type": kind, "text": String::from_utf8_lossy(t) }))).collect()
}

/// The events that end a run: the unterminated tails, then `last`.
pub(super) fn ending(out: &mut Lines, err: &mut Lines, last: Bytes) -> Vec<Bytes> {
    let mut events = output_events("stdout", out.finish().into_iter().collect());
    events.extend(output_events("stderr", err.finish().into_iter().collect()));
    events.push(last);
    events
}

pub(crate) fn complete_event(started: Instant) -> Bytes {
    event(json!({ "type": "execution_complete", "execution_time": started.elapsed().as_millis() as u64 }))
}

pub(crate) fn error_event(code: i32, message: &str) -> Bytes {
    event(json!({
        "type": "error",
        "error": { "ename": "CommandExecError", "evalue": code.to_string(), "traceback": [message] },
    }))
}

pub(crate) fn sse(body: Body) -> Response<Body> {
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert("content-type", "text/event-stream".parse().expect("static"));
    h.insert("cache-control", "no-cache".parse().expect("static"));
    resp
}
