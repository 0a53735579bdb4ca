//! A small `multipart/form-data` reader for `POST /files/upload`: the body is
//! already in memory, so this only splits it at the boundary and reads each
//! part's `Content-Disposition` name.

/// One part: its field name and where its data lies in the body (no copy:
/// uploads can be large).
#[derive(Debug)]
pub struct Part {
    pub name: String,
    pub data: std::ops::Range<usize>,
}

/// Where `needle` first occurs in `haystack` at or after `from`.
pub(crate) fn find(haystack: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    haystack.get(from..)?.windows(needle.len()).position(|w| w == needle).map(|p| p + from)
}

pub fn parse(body: &[u8], boundary: &str) -> Result<Vec<Part>, String> {
    let delimiter = format!("--{boundary}").into_bytes();
    let mut pos = find(body, &delimiter, 0).ok_or("the body does not contain its multipart boundary")?;
    let mut parts = Vec::new();
    loop {
        pos += delimiter.len();
        if body.get(pos..pos + 2) == Some(b"--") {
            return Ok(parts);
        }
        pos += 2; // CRLF after the delimiter
        let header_end = find(body, b"\r\n\r\n", pos).ok_or("a multipart part has no end of headers")?;
        let headers = String::from_utf8_lossy(&body[pos..header_end]);
        let name = headers
            .lines()
            .filter(|l| l.to_ascii_lowercase().starts_with("content-disposition:"))
            .flat_map(|l| l.split(';'))
            .find_map(|p| p.trim().strip_prefix("name=").map(|n| n.trim_matches('"').to_owned()))
            .ok_or("a multipart part has no Content-Disposition name")?;
        let data_start = header_end + 4;
        let mut next_delim = b"\r\n".to_vec();
        next_delim.extend_from_slice(&delimiter);
        let data_end = find(body, &next_delim, data_start).ok_or("a multipart part is not terminated")?;
        parts.push(Part { name, data: data_start..data_end });
        pos = data_end + 2;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_the_sdk_upload_shape() {
        let body = b"--B\r\nContent-Disposition: form-data; name=\"metadata\"; filename=\"metadata\"\r\nContent-Type: application/json\r\n\r\n{\"path\": \"/tmp/a\"}\r\n--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\nline1\r\nline2\r\n--B--\r\n";
        let parts = super::parse(body, "B").unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].name, "metadata");
        assert_eq!(&body[parts[1].data.clone()], b"line1\r\nline2");
        assert!(super::parse(b"garbage", "B").is_err());
    }
}
