//! The delta disk's contract between the host, which builds it, and the
//! agent, which finishes it before mounting the workspace overlay.
//!
//! The delta is a small ext4 image the host makes each start from what
//! changed in the workspace since the cached base image was built. A
//! rootless host cannot give files other owners, create device nodes or
//! whiteouts, so the image carries the changed files, directories and
//! symlinks under [`DELTA_LAYER`] and a [`DeltaManifest`] at
//! [`DELTA_MANIFEST`] saying what the guest (as root) must still do: create
//! the special nodes, white out what the base has beyond each changed
//! directory's listing, and set every entry's exact owner, mode, xattrs and
//! mtime. The layer then sits above the base in the overlay's lower stack.

use serde::{Deserialize, Serialize};

/// The overlay layer inside the delta image (the image root also holds the manifest).
pub const DELTA_LAYER: &str = "layer";
/// The manifest file at the delta image's root, outside the layer.
pub const DELTA_MANIFEST: &str = "pvisor-delta.json";
/// The manifest format this agent understands.
pub const DELTA_FORMAT: u32 = 1;

/// What the guest does to the delta layer before it is used (see the module doc).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeltaManifest {
    pub format: u32,
    /// Every entry of the layer, the layer root (empty path) included,
    /// parents before children.
    pub entries: Vec<DeltaEntry>,
}

/// One entry of the delta layer, with the host's metadata for it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeltaEntry {
    /// Relative to the layer root, as raw bytes (names need not be UTF-8).
    pub path: Vec<u8>,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime_ns: i64,
    /// Extended attributes (name, value) the host could read.
    #[serde(default)]
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// A node the guest creates (the image cannot carry it).
    #[serde(default)]
    pub node: Option<DeltaNode>,
    /// For a changed directory: all its names on the host now. The guest
    /// whites out every name the base has there beyond these.
    #[serde(default)]
    pub listing: Option<Vec<Vec<u8>>>,
}

/// A special file the guest creates in the layer with `mknod(2)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeltaNode {
    Fifo,
    Socket,
    Char { rdev: u64 },
    Block { rdev: u64 },
}

/// Why a delta manifest cannot be used. The error is written out by hand:
/// this crate keeps to `serde`, `serde_json` and `libc`.
#[derive(Debug)]
pub enum DeltaManifestError {
    Corrupt(serde_json::Error),
    UnknownFormat(u32),
}

impl std::fmt::Display for DeltaManifestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Corrupt(e) => write!(f, "the delta manifest is corrupt: {e}"),
            Self::UnknownFormat(format) => write!(
                f,
                "the delta manifest has format {format}; this agent knows {DELTA_FORMAT} (rebuild the guest image)"
            ),
        }
    }
}

impl std::error::Error for DeltaManifestError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Corrupt(e) => Some(e),
            Self::UnknownFormat(_) => None,
        }
    }
}

impl DeltaManifest {
    /// Parses a manifest, refusing a format this agent does not know.
    pub fn parse(bytes: &[u8]) -> Result<Self, DeltaManifestError> {
        let manifest: Self = serde_json::from_slice(bytes).map_err(DeltaManifestError::Corrupt)?;
        if manifest.format != DELTA_FORMAT {
            return Err(DeltaManifestError::UnknownFormat(manifest.format));
        }
        Ok(manifest)
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_round_trips_and_an_unknown_format_is_refused() {
        let manifest = DeltaManifest {
            format: DELTA_FORMAT,
            entries: vec![DeltaEntry {
                path: b"d/\xffname".to_vec(),
                mode: 0o4755,
                uid: 1000,
                gid: 1000,
                mtime_ns: 1_700_000_000_123_456_789,
                xattrs: vec![(b"user.k".to_vec(), b"v".to_vec())],
                node: Some(DeltaNode::Char { rdev: 0x0501 }),
                listing: Some(vec![b"a".to_vec()]),
            }],
        };
        assert_eq!(DeltaManifest::parse(&manifest.to_bytes()).unwrap(), manifest);
        let newer = DeltaManifest { format: DELTA_FORMAT + 1, entries: Vec::new() };
        let e = DeltaManifest::parse(&newer.to_bytes()).unwrap_err().to_string();
        assert!(e.contains("rebuild the guest image"), "{e}");
        assert!(DeltaManifest::parse(b"{").unwrap_err().to_string().contains("corrupt"));
    }
}
