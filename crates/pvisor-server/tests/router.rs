//! The router driven without a socket: `pvisor_server::handle` on requests
//! built in memory, over a daemon on a fresh state directory (no VM needed
//! for these routes).

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Request, StatusCode};

fn daemon() -> (tempfile::TempDir, Arc<pvisor_server::Daemon>) {
    let dir = tempfile::tempdir().unwrap();
    let config = pvisor_server::Config {
        state_root: dir.path().join("state"),
        pvisor: "/nonexistent/pvisor".into(),
        max_timeout: Duration::from_secs(3600),
        log_level: None,
        volumes: Default::default(),
    };
    (dir, pvisor_server::Daemon::open(config, Vec::new()).unwrap())
}

fn call(
    daemon: &Arc<pvisor_server::Daemon>,
    key: Option<&str>,
    req: Request<Full<Bytes>>,
) -> (StatusCode, hyper::HeaderMap, serde_json::Value) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let response = pvisor_server::handle(daemon.clone(), key.map(|k| Arc::new(k.to_owned())), req).await;
        let (parts, body) = response.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        (parts.status, parts.headers, serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null))
    })
}

fn get(path: &str) -> hyper::http::request::Builder {
    Request::get(path).header("host", "127.0.0.1:8080")
}

#[test]
fn health_auth_errors_and_request_ids() {
    let (_dir, daemon) = daemon();
    const KEY: &str = "0123456789abcdef0123";
    let key = Some(KEY);
    let (status, headers, body) = call(&daemon, key, get("/health").body(Full::default()).unwrap());
    assert_eq!((status, body["status"].as_str()), (StatusCode::OK, Some("healthy")));
    assert_eq!(headers["x-request-id"].len(), 36, "a generated UUID");

    let (status, headers, body) = call(
        &daemon,
        key,
        get("/v1/sandboxes").header("x-request-id", "mine").body(Full::default()).unwrap(),
    );
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["code"], "UNAUTHORIZED");
    assert_eq!(headers["x-request-id"], "mine");

    let authed = |path: &str| get(path).header("open-sandbox-api-key", KEY);
    let (status, _, body) = call(&daemon, key, authed("/v1/sandboxes").body(Full::default()).unwrap());
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["pagination"]["totalItems"], 0);
    // The `/` alias and the {code, message} envelope of a missing sandbox.
    let (status, _, body) = call(&daemon, key, authed("/sandboxes/sb-nope").body(Full::default()).unwrap());
    assert_eq!((status, body["code"].as_str()), (StatusCode::NOT_FOUND, Some("NOT_FOUND")));
    assert!(body["message"].as_str().unwrap().contains("sb-nope"));
    // An image nobody imported: a 400 that says how to import it.
    let create = Request::post("/v1/sandboxes")
        .header("host", "127.0.0.1:8080")
        .header("open-sandbox-api-key", KEY)
        .body(Full::new(Bytes::from(r#"{"image":{"uri":"python:3.11"},"entrypoint":["python"]}"#)))
        .unwrap();
    let (status, _, body) = call(&daemon, key, create);
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["message"].as_str().unwrap().contains("pvisor image import python:3.11"), "{body}");
    // Execd of a sandbox that does not exist.
    let (status, _, _) =
        call(&daemon, key, get("/sandboxes/sb-nope/port/44772/ping").body(Full::default()).unwrap());
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[test]
fn without_a_key_browsers_and_foreign_hosts_are_refused() {
    let (_dir, daemon) = daemon();
    let (status, _, _) = call(&daemon, None, get("/v1/sandboxes").body(Full::default()).unwrap());
    assert_eq!(status, StatusCode::OK);
    let page = get("/v1/sandboxes").header("origin", "https://example.com").body(Full::default()).unwrap();
    assert_eq!(call(&daemon, None, page).0, StatusCode::FORBIDDEN);
    let rebound =
        Request::get("/v1/sandboxes").header("host", "attacker.example:8080").body(Full::default()).unwrap();
    assert_eq!(call(&daemon, None, rebound).0, StatusCode::FORBIDDEN);
}
