//! What `pvisor serve` parses from untrusted HTTP clients without a library:
//! multipart upload bodies, query strings and RFC 3339 times. None may panic;
//! parts must lie inside the body.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (boundary, body) = match data.iter().position(|b| *b == b'\n') {
        Some(i) => (String::from_utf8_lossy(&data[..i]).into_owned(), &data[i + 1..]),
        None => ("B".to_owned(), data),
    };
    if let Ok(parts) = pvisor_server::multipart::parse(body, &boundary) {
        for part in &parts {
            assert!(part.data.start <= part.data.end && part.data.end <= body.len());
        }
    }
    let text = String::from_utf8_lossy(data);
    let _ = pvisor_server::http::query_pairs(Some(&text));
    let _ = pvisor_server::http::parse_rfc3339(&text);
});
