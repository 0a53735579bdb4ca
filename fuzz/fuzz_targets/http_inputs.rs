//! What `pvisor serve` parses from untrusted HTTP clients without a library:
//! query strings and RFC 3339 times. None may panic. (Multipart upload
//! bodies are parsed by `multer`, a maintained streaming parser, since
//! issue 18; the hand-written parser this target used to fuzz is gone.)
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = pvisor_server::http::query_pairs(Some(&text));
    let _ = pvisor_server::http::parse_rfc3339(&text);
    let _ = pvisor_server::http::path_segment(&text);
});
