//! The frame format on the AgentCtl port: `u32 header length | u32 payload
//! length | JSON header | raw payload`, both lengths big-endian, with the
//! limits a reader enforces so a corrupt stream is an error, not an allocation.

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

/// Largest header and payload accepted; a larger length is a corrupt stream.
pub const MAX_HEADER: u32 = 1 << 20;
pub const MAX_PAYLOAD: u32 = 16 << 20;

/// Writes one frame.
pub fn write_frame<T: Serialize>(w: &mut impl Write, header: &T, payload: &[u8]) -> io::Result<()> {
    let header = serde_json::to_vec(header).map_err(io::Error::other)?;
    // The reader would reject it and lose its place in the stream: refuse here.
    if header.len() > MAX_HEADER as usize || payload.len() > MAX_PAYLOAD as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a {}-byte header or {}-byte payload exceeds the protocol limits",
                header.len(),
                payload.len()
            ),
        ));
    }
    let mut buf = Vec::with_capacity(8 + header.len() + payload.len());
    buf.extend_from_slice(&(header.len() as u32).to_be_bytes());
    buf.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    buf.extend_from_slice(&header);
    buf.extend_from_slice(payload);
    w.write_all(&buf)?;
    w.flush()
}

/// The header key of a request's id (host → guest).
pub const REQUEST_ID: &str = "seq";
/// The header key naming the request a reply answers (guest → host).
pub const ANSWERS: &str = "re";

/// Writes one frame whose header also carries `key: id` (a request's id, or
/// the id of the request a reply answers), beside the message's own fields.
/// Without `id` it is exactly [`write_frame`].
pub fn write_tagged<T: Serialize>(
    w: &mut impl Write,
    key: &str,
    id: Option<u64>,
    header: &T,
    payload: &[u8],
) -> io::Result<()> {
    let Some(id) = id else { return write_frame(w, header, payload) };
    let mut value = serde_json::to_value(header).map_err(io::Error::other)?;
    let serde_json::Value::Object(fields) = &mut value else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "a tagged header must be an object"));
    };
    fields.insert(key.to_owned(), id.into());
    write_frame(w, &value, payload)
}

/// A frame read by [`read_tagged`]: the message, its id, the payload.
pub type Tagged<T> = (T, Option<u64>, Vec<u8>);

/// Reads one frame written by [`write_tagged`]: the message, its `key` id
/// if it has one (which must be an unsigned integer), and the payload.
pub fn read_tagged<T: for<'de> Deserialize<'de>>(
    r: &mut impl Read,
    key: &str,
) -> io::Result<Option<Tagged<T>>> {
    let Some((mut value, payload)) = read_frame::<serde_json::Value>(r)? else { return Ok(None) };
    let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, format!("bad frame header: {what}"));
    let id = match value.as_object_mut().and_then(|fields| fields.remove(key)) {
        None => None,
        Some(id) => Some(id.as_u64().ok_or_else(|| bad(format!("{key} is {id}, not an id")))?),
    };
    let message = serde_json::from_value(value).map_err(|e| bad(e.to_string()))?;
    Ok(Some((message, id, payload)))
}

/// A read that failed inside a frame: a timeout there is not silence (part
/// of the frame is consumed, so the stream cannot go on), but a broken frame.
fn inside_frame(e: io::Error) -> io::Error {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            io::Error::new(io::ErrorKind::UnexpectedEof, "the stream stalled inside a frame")
        }
        _ => e,
    }
}

/// Reads one frame. `Ok(None)` is a clean end of stream before a frame
/// began; a read timeout is returned as such only before a frame began.
pub fn read_frame<T: for<'de> Deserialize<'de>>(r: &mut impl Read) -> io::Result<Option<(T, Vec<u8>)>> {
    let mut lens = [0u8; 8];
    let mut got = 0;
    while got < lens.len() {
        match r.read(&mut lens[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "stream ended inside a frame")),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if got == 0 => return Err(e),
            Err(e) => return Err(inside_frame(e)),
        }
    }
    let [h0, h1, h2, h3, p0, p1, p2, p3] = lens;
    let (hlen, plen) = (u32::from_be_bytes([h0, h1, h2, h3]), u32::from_be_bytes([p0, p1, p2, p3]));
    if hlen > MAX_HEADER || plen > MAX_PAYLOAD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame lengths {hlen}/{plen} exceed the protocol limits"),
        ));
    }
    let mut header = vec![0; hlen as usize];
    r.read_exact(&mut header).map_err(inside_frame)?;
    let mut payload = vec![0; plen as usize];
    r.read_exact(&mut payload).map_err(inside_frame)?;
    let header = serde_json::from_slice(&header)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("bad frame header: {e}")))?;
    Ok(Some((header, payload)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EntryKind, Reply, Request};

    /// A reader that hands out its bytes, then times out.
    struct Stalls(io::Cursor<Vec<u8>>);

    impl Read for Stalls {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            match self.0.read(buf)? {
                0 => Err(io::ErrorKind::WouldBlock.into()),
                n => Ok(n),
            }
        }
    }

    /// A timeout before a frame begins is silence (the caller may read on);
    /// one inside a frame breaks the stream, never reads as silence.
    #[test]
    fn a_timeout_is_silence_only_between_frames() {
        let mut frame = Vec::new();
        write_frame(&mut frame, &Reply::Exited { id: 2, code: Some(0), signal: None }, b"").expect("frame");
        let silent = read_frame::<Reply>(&mut Stalls(io::Cursor::new(Vec::new()))).expect_err("silence");
        assert_eq!(silent.kind(), io::ErrorKind::WouldBlock);
        for cut in [3, 8, frame.len() - 1] {
            let mut stalled = Stalls(io::Cursor::new(frame[..cut].to_vec()));
            let broken = read_frame::<Reply>(&mut stalled).expect_err("a cut frame");
            assert_eq!(broken.kind(), io::ErrorKind::UnexpectedEof, "cut at {cut}");
        }
    }

    #[test]
    fn frames_round_trip_with_binary_payload_and_paths() {
        let mut buf = Vec::new();
        let entry = Reply::Entry {
            path: b"a\nb\xff".to_vec(),
            kind: EntryKind::File,
            mode: 0o644,
            mtime_ns: -1,
            size: 3,
            target: None,
            opaque: false,
        };
        write_frame(&mut buf, &entry, &[0, 1, 2]).unwrap();
        write_frame(&mut buf, &Reply::Data, b"").unwrap();
        let mut r = &buf[..];
        let (h, p): (Reply, _) = read_frame(&mut r).unwrap().unwrap();
        assert_eq!((h, p), (entry, vec![0, 1, 2]));
        let (h, _): (Reply, _) = read_frame(&mut r).unwrap().unwrap();
        assert_eq!(h, Reply::Data);
        assert!(read_frame::<Reply>(&mut r).unwrap().is_none());
    }

    #[test]
    fn a_tag_travels_beside_the_message_and_an_untagged_frame_has_none() {
        let mut buf = Vec::new();
        write_tagged(&mut buf, REQUEST_ID, Some(7), &Request::Export, b"p").unwrap();
        write_tagged(&mut buf, REQUEST_ID, None, &Request::Thaw, b"").unwrap();
        let mut r = &buf[..];
        let tagged = read_tagged::<Request>(&mut r, REQUEST_ID).unwrap().unwrap();
        assert_eq!(tagged, (Request::Export, Some(7), b"p".to_vec()));
        let plain = read_tagged::<Request>(&mut r, REQUEST_ID).unwrap().unwrap();
        assert_eq!(plain, (Request::Thaw, None, Vec::new()));
        // The message itself still refuses fields it does not know.
        let mut buf = Vec::new();
        write_tagged(&mut buf, "other", Some(1), &Request::Status { id: 1 }, b"").unwrap();
        assert!(read_tagged::<Request>(&mut &buf[..], REQUEST_ID).is_err());
        let mut buf = Vec::new();
        write_frame(&mut buf, &serde_json::json!({"type": "ready", "re": "x"}), b"").unwrap();
        assert!(read_tagged::<Reply>(&mut &buf[..], ANSWERS).is_err());
    }

    #[test]
    fn corrupt_lengths_and_truncation_are_errors() {
        let mut r = &[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0][..];
        assert_eq!(read_frame::<Reply>(&mut r).unwrap_err().kind(), io::ErrorKind::InvalidData);
        let mut r = &[0, 0][..];
        assert_eq!(read_frame::<Reply>(&mut r).unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
        let mut buf = Vec::new();
        write_frame(&mut buf, &serde_json::json!({"type": "nope"}), b"").unwrap();
        assert!(read_frame::<Request>(&mut &buf[..]).is_err());
    }
}
