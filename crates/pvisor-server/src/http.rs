//! HTTP plumbing shared by the lifecycle and execd routes: the error
//! envelope, JSON and streamed bodies, query strings, request ids, auth.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body_util::{combinators::BoxBody, BodyExt, Full, Limited};
use hyper::body::{Bytes, Frame};
use hyper::{Response, StatusCode};
use serde::Serialize;

pub type Body = BoxBody<Bytes, Infallible>;

/// An error answered as the spec's `{code, message}` envelope.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, code, message: message.into() }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "INVALID_REQUEST", message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "NOT_FOUND", message)
    }
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "INVALID_STATE", message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL_ERROR", message)
    }
    pub fn into_response(self) -> Response<Body> {
        json(self.status, &serde_json::json!({ "code": self.code, "message": self.message }))
    }
}

pub type ApiResult = Result<Response<Body>, ApiError>;

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}

pub fn json<T: Serialize + ?Sized>(status: StatusCode, value: &T) -> Response<Body> {
    let bytes = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    let mut response = Response::new(full(bytes));
    *response.status_mut() = status;
    response.headers_mut().insert("content-type", "application/json".parse().expect("static header"));
    response
}

pub fn empty(status: StatusCode) -> Response<Body> {
    let mut response = Response::new(full(Bytes::new()));
    *response.status_mut() = status;
    response
}

/// A response body fed by a channel: SSE events, file downloads. The
/// sender sees the receiver dropped when the client goes away.
#[derive(Debug)]
pub struct ChannelBody {
    rx: tokio::sync::mpsc::Receiver<Bytes>,
}

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx.poll_recv(cx).map(|chunk| chunk.map(|bytes| Ok(Frame::data(bytes))))
    }
}

pub fn channel_body(capacity: usize) -> (tokio::sync::mpsc::Sender<Bytes>, Body) {
    let (tx, rx) = tokio::sync::mpsc::channel(capacity);
    (tx, BodyExt::boxed(ChannelBody { rx }))
}

/// Reads a request body of at most `limit` bytes (chunked or not).
pub async fn read_body<B>(body: B, limit: usize) -> Result<Bytes, ApiError>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "PAYLOAD_TOO_LARGE",
            format!("the request body exceeds {} MiB", limit >> 20),
        )),
        Err(e) => Err(ApiError::bad_request(format!("cannot read the request body: {e}"))),
    }
}

/// Parses a JSON body, naming what was wrong with it.
pub fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| ApiError::bad_request(format!("invalid {what}: {e}")))
}

/// The decoded `key=value` pairs of a query string, in order.
pub fn query_pairs(query: Option<&str>) -> Result<Vec<(String, String)>, ApiError> {
    query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            Ok((percent_decode(k)?, percent_decode(v)?))
        })
        .collect()
}

pub fn query_one<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

pub fn query_all<'a>(pairs: &'a [(String, String)], key: &str) -> Vec<&'a str> {
    pairs.iter().filter(|(k, _)| k == key).map(|(_, v)| v.as_str()).collect()
}

/// One page of `items` as the spec's list responses carry it (`items` and
/// `pagination`), by the query's `page` and `pageSize` (at most 1000).
pub fn page_of(q: &[(String, String)], items: Vec<serde_json::Value>) -> Result<serde_json::Value, ApiError> {
    let number = |key: &str, default: u64| -> Result<u64, ApiError> {
        match query_one(q, key) {
            None => Ok(default),
            Some(v) => v
                .parse::<u64>()
                .ok()
                .filter(|n| *n >= 1)
                .ok_or_else(|| ApiError::bad_request(format!("{key} must be an integer >= 1"))),
        }
    };
    let (page, size) = (number("page", 1)?, number("pageSize", 20)?.min(1000));
    let total = items.len() as u64;
    let pages = total.div_ceil(size);
    let slice: Vec<serde_json::Value> =
        items.into_iter().skip(((page - 1) * size) as usize).take(size as usize).collect();
    Ok(serde_json::json!({
        "items": slice,
        "pagination": { "page": page, "pageSize": size, "totalItems": total, "totalPages": pages, "hasNextPage": page < pages },
    }))
}

/// Decodes one query component: `+` is a space (as Go's `url.ParseQuery`,
/// which the reference execd uses, and every form encoder agree), `%XX` a
/// byte, and the result must be UTF-8: a path that is not would otherwise be
/// replaced with U+FFFD and name some other file, so it is a 400 instead.
pub fn percent_decode(s: &str) -> Result<String, ApiError> {
    strict_decode(&s.replace('+', " "), s)
}

/// Decodes one path segment: `%XX` only (a `+` in a path is a plus sign),
/// UTF-8 or a 400.
pub fn path_segment(s: &str) -> Result<String, ApiError> {
    strict_decode(s, s)
}

fn strict_decode(s: &str, shown: &str) -> Result<String, ApiError> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| ApiError::bad_request(format!("{shown:?} is not UTF-8 once percent-decoded")))
}

/// Compares secrets in time independent of where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u8;
    for (i, x) in a.iter().enumerate() {
        diff |= x ^ b.get(i).copied().unwrap_or(0);
    }
    // Equal lengths were folded in above; a shorter `b` compared against zeros.
    diff == 0 && a.len() == b.len()
}

/// A random version-4 UUID (request ids, access tokens).
pub fn uuid4() -> String {
    let mut b = pvisor_core::random::must::<16>();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

pub fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Parses RFC 3339 with any offset (`Z`, `+00:00`, `-05:30`) and up to nine
/// fractional digits, as SDKs send it.
pub fn parse_rfc3339(s: &str) -> Option<std::time::SystemTime> {
    let s = s.trim();
    let (body, offset_secs) = if let Some(b) = s.strip_suffix('Z').or_else(|| s.strip_suffix('z')) {
        (b, 0i64)
    } else if s.len() > 6
        && matches!(&s.as_bytes()[s.len() - 6], b'+' | b'-')
        && s.as_bytes()[s.len() - 3] == b':'
    {
        let (b, off) = s.split_at(s.len() - 6);
        let sign = if off.starts_with('-') { -1 } else { 1 };
        let h: i64 = off[1..3].parse().ok()?;
        let m: i64 = off[4..6].parse().ok()?;
        (b, sign * (h * 3600 + m * 60))
    } else {
        (s, 0)
    };
    let (whole, frac) = match body.split_once('.') {
        Some((w, f)) => (w, f),
        None => (body, ""),
    };
    let base = humantime::parse_rfc3339(&format!("{whole}Z")).ok()?;
    let mut nanos = 0u32;
    if !frac.is_empty() {
        if !frac.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let digits = &frac[..frac.len().min(9)];
        nanos = format!("{digits:0<9}").parse().ok()?;
    }
    let t = base + std::time::Duration::from_nanos(u64::from(nanos));
    Some(if offset_secs >= 0 {
        t - std::time::Duration::from_secs(offset_secs as u64)
    } else {
        t + std::time::Duration::from_secs((-offset_secs) as u64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_timestamps_sdks_send() {
        let z = parse_rfc3339("2026-11-30T15:39:20Z").unwrap();
        assert_eq!(parse_rfc3339("2026-11-30T15:39:20+00:00").unwrap(), z);
        assert_eq!(parse_rfc3339("2026-11-30T17:39:20+02:00").unwrap(), z);
        let micro = parse_rfc3339("2026-11-30T15:39:20.891089+00:00").unwrap();
        assert_eq!(micro.duration_since(z).unwrap().as_micros(), 891_089);
        assert!(parse_rfc3339("yesterday").is_none());
    }

    #[test]
    fn decodes_queries_and_compares_secrets() {
        let q = query_pairs(Some("path=%2Ftmp%2Fa+b.txt&path=x&depth=2")).unwrap();
        assert_eq!(query_all(&q, "path"), ["/tmp/a b.txt", "x"]);
        assert_eq!(query_one(&q, "depth"), Some("2"));
        assert_eq!(percent_decode("100%").unwrap(), "100%");
        assert_eq!(percent_decode("a%2Bb+c").unwrap(), "a+b c");
        // Not UTF-8 once decoded: refused, never replaced with U+FFFD.
        assert!(percent_decode("%FF%FE").is_err());
        assert_eq!(path_segment("a+b%20c").unwrap(), "a+b c");
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
        assert_eq!(uuid4().len(), 36);
    }
}
