//! Workspace-relative paths as raw bytes, serialized as a string when UTF-8
//! and as hex otherwise, and refused when not plain and relative.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

use serde::{Deserialize, Serialize};

/// A workspace-relative path, kept as raw bytes so no file name is ever lost.
///
/// Serialized as a JSON string when the bytes are UTF-8, otherwise as
/// `{"hex": "<bytes>"}`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RelPath(Vec<u8>);

impl RelPath {
    /// Wraps a relative path.
    pub fn new(path: &Path) -> Self {
        Self(path.as_os_str().as_bytes().to_vec())
    }
    /// Returns the path.
    pub fn as_path(&self) -> &Path {
        Path::new(OsStr::from_bytes(&self.0))
    }
    /// Whether `bytes` is a non-empty relative path of plain names (no `/`
    /// prefix, no `.` or `..`, no empty components, no NUL).
    pub fn is_plain_relative(bytes: &[u8]) -> bool {
        !bytes.is_empty()
            && !bytes.contains(&0)
            && bytes.split(|&b| b == b'/').all(|c| !c.is_empty() && c != b"." && c != b"..")
    }

    /// Returns the path for a person's terminal: control, escape, bidi and
    /// invisible formatting characters and invalid UTF-8 shown escaped
    /// (see [`crate::text`]).
    pub fn display_escaped(&self) -> String {
        crate::text::escape_bytes(&self.0, crate::text::Tabs::Escape)
    }
}

impl fmt::Debug for RelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.display_escaped())
    }
}

impl Serialize for RelPath {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match std::str::from_utf8(&self.0) {
            Ok(text) => s.serialize_str(text),
            Err(_) => {
                use serde::ser::SerializeMap;
                let hex: String = self.0.iter().map(|b| format!("{b:02x}")).collect();
                let mut map = s.serialize_map(Some(1))?;
                map.serialize_entry("hex", &hex)?;
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for RelPath {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            Text(String),
            Hex { hex: String },
        }
        let bytes = match Repr::deserialize(d)? {
            Repr::Text(t) => t.into_bytes(),
            Repr::Hex { hex } => (0..hex.len())
                .step_by(2)
                .map(|i| hex.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
                .collect::<Option<Vec<u8>>>()
                .ok_or_else(|| serde::de::Error::custom("invalid hex path"))?,
        };
        // A record is input too: only plain relative names, never `/x` or `..`.
        if !Self::is_plain_relative(&bytes) {
            return Err(serde::de::Error::custom(format!(
                "path {:?} is not a plain relative path",
                String::from_utf8_lossy(&bytes)
            )));
        }
        Ok(Self(OsString::from_vec(bytes).into_vec()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rel_paths_keep_every_byte() {
        let odd = RelPath(b"dir/new\nline\xff".to_vec());
        let json = serde_json::to_string(&odd).unwrap();
        assert!(json.contains("hex"), "{json}");
        assert_eq!(serde_json::from_str::<RelPath>(&json).unwrap(), odd);
        assert_eq!(odd.display_escaped(), "dir/new\\nline\\xff");
        for bad in
            ["\"/etc/passwd\"", "\"../x\"", "\"a/../../x\"", "\"\"", "\"a//b\"", "{\"hex\": \"2e2e2f78\"}"]
        {
            assert!(serde_json::from_str::<RelPath>(bad).is_err(), "{bad}");
        }
        let plain = RelPath::new(Path::new("a/b.txt"));
        assert_eq!(serde_json::to_string(&plain).unwrap(), "\"a/b.txt\"");
    }
}
