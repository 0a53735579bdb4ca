//! Importing an OCI image layout: `index.json` → the manifest → its
//! config and layers, every blob read through a digest and a byte count
//! and checked against its descriptor before anything it says is used.
//! The layers themselves are unpacked by [`crate::layers`].

use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use oci_spec::image::{Arch, Descriptor, DigestAlgorithm, ImageIndex, ImageManifest, MediaType, Os};
use pvisor_stage::beneath::Root;

use super::{decompressed, err, read_image_file, Compression, ImageError};
use crate::layers::{self, Unpacked};

/// The largest index, manifest or config JSON an import reads.
const MAX_JSON_BLOB: u64 = 4 << 20;

/// A digest being computed over a blob's bytes as they are read.
enum Hasher {
    Sha256(sha2::Sha256),
    Sha512(sha2::Sha512),
}

impl Hasher {
    fn update(&mut self, bytes: &[u8]) {
        use sha2::Digest;
        match self {
            Self::Sha256(h) => h.update(bytes),
            Self::Sha512(h) => h.update(bytes),
        }
    }
    fn hex(self) -> String {
        use sha2::Digest;
        let bytes = match self {
            Self::Sha256(h) => h.finalize().to_vec(),
            Self::Sha512(h) => h.finalize().to_vec(),
        };
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Reads through to `inner`, hashing and counting every byte.
struct Hashing<R> {
    inner: R,
    hasher: Hasher,
    read: u64,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.read += n as u64;
        Ok(n)
    }
}

/// One blob of an OCI layout, checked against its descriptor.
struct Blob<'a> {
    layout: &'a Root,
    descriptor: &'a Descriptor,
}

impl Blob<'_> {
    fn name(&self) -> String {
        self.descriptor.digest().to_string()
    }

    /// `blobs/<algorithm>/<hex>`, for an algorithm the import can verify.
    fn open(&self) -> Result<(fs::File, Hasher), ImageError> {
        let digest = self.descriptor.digest();
        let hasher = match digest.algorithm() {
            DigestAlgorithm::Sha256 => Hasher::Sha256(Default::default()),
            DigestAlgorithm::Sha512 => Hasher::Sha512(Default::default()),
            other => return Err(err(format!("blob {digest}: digest algorithm {other} cannot be verified"))),
        };
        let hex = digest.digest();
        let rel = PathBuf::from("blobs").join(digest.algorithm().as_ref()).join(hex);
        let file = self
            .layout
            .open_file(&rel)
            .map_err(|e| err(format!("blob {digest}: cannot open {} ({e})", rel.display())))?;
        let len = file.metadata().map_err(|e| err(format!("blob {digest}: {e}")))?.len();
        if len != self.descriptor.size() {
            return Err(err(format!(
                "blob {digest} holds {len} bytes, not the {} its descriptor says; refusing the image",
                self.descriptor.size()
            )));
        }
        Ok((file, hasher))
    }

    /// Fails unless what was read is the blob its descriptor names.
    fn verify<R: Read>(&self, mut hashing: Hashing<R>) -> Result<(), ImageError> {
        io::copy(&mut hashing, &mut io::sink()).map_err(|e| err(format!("blob {}: {e}", self.name())))?;
        let (read, hex) = (hashing.read, hashing.hasher.hex());
        if read != self.descriptor.size() || hex != self.descriptor.digest().digest() {
            return Err(err(format!(
                "blob {} does not match its digest (its {read} bytes hash to {}:{hex}); refusing the image",
                self.name(),
                self.descriptor.digest().algorithm()
            )));
        }
        Ok(())
    }

    /// The whole (small) blob, verified.
    fn bytes(&self, limit: u64) -> Result<Vec<u8>, ImageError> {
        if self.descriptor.size() > limit {
            return Err(err(format!("blob {} is over {limit} bytes; refusing the image", self.name())));
        }
        let (file, hasher) = self.open()?;
        let mut hashing = Hashing { inner: file, hasher, read: 0 };
        let mut bytes = Vec::new();
        (&mut hashing)
            .take(limit)
            .read_to_end(&mut bytes)
            .map_err(|e| err(format!("blob {}: {e}", self.name())))?;
        self.verify(hashing)?;
        Ok(bytes)
    }

    /// Reads the whole blob through `use_it` (as a layer, decompressed),
    /// then checks every byte of it against the digest.
    fn read_through(
        &self,
        compression: Compression,
        use_it: impl FnOnce(&mut dyn Read) -> Result<(), layers::LayerError>,
    ) -> Result<(), ImageError> {
        let (file, hasher) = self.open()?;
        let mut hashing = Hashing { inner: file, hasher, read: 0 };
        let used = use_it(&mut decompressed(&mut hashing, compression));
        // A mismatch says more than what it made the unpacking do.
        self.verify(hashing)?;
        used.map_err(|e| err(format!("layer {}: {e}", self.name())))
    }
}

/// The descriptor of the linux/amd64 image in `manifests`, or the only one.
fn choose(manifests: &[Descriptor], what: &str) -> Result<Descriptor, ImageError> {
    let amd64 = manifests.iter().find(|m| {
        m.platform().as_ref().is_some_and(|p| *p.architecture() == Arch::Amd64 && *p.os() == Os::Linux)
    });
    amd64.or(manifests.first()).cloned().ok_or_else(|| err(format!("{what} lists no manifest")))
}

/// An OCI image layout: `index.json` → the (linux/amd64 or only) manifest →
/// its config and layers, every blob checked against its descriptor's size
/// and digest; each layer's whiteouts, then its entries, unpacked by
/// [`crate::layers`]. Gzip and plain tar layers; zstd is refused.
pub(super) fn import_oci(layout: &Path, dest: &Root, report: &mut Unpacked) -> Result<(), ImageError> {
    let root = Root::open(layout).map_err(|e| err(format!("cannot open {}: {e}", layout.display())))?;
    let index_json = read_image_file(layout, Path::new("index.json"), MAX_JSON_BLOB)
        .map_err(|e| err(e.to_string()))?
        .ok_or_else(|| err(format!("{} has no index.json", layout.display())))?;
    let index = ImageIndex::from_reader(&index_json[..])
        .map_err(|e| err(format!("{}/index.json is not an OCI image index: {e}", layout.display())))?;
    let mut chosen = choose(index.manifests(), "index.json")?;
    // An index may point at a nested index (multi-platform images).
    for _ in 0..2 {
        if *chosen.media_type() != MediaType::ImageIndex {
            break;
        }
        let nested = Blob { layout: &root, descriptor: &chosen }.bytes(MAX_JSON_BLOB)?;
        let nested = ImageIndex::from_reader(&nested[..])
            .map_err(|e| err(format!("blob {} is not an image index: {e}", chosen.digest())))?;
        chosen = choose(nested.manifests(), "a nested image index")?;
    }
    let manifest = Blob { layout: &root, descriptor: &chosen }.bytes(MAX_JSON_BLOB)?;
    let manifest = ImageManifest::from_reader(&manifest[..])
        .map_err(|e| err(format!("blob {} is not an image manifest: {e}", chosen.digest())))?;
    Blob { layout: &root, descriptor: manifest.config() }.bytes(MAX_JSON_BLOB)?;
    if manifest.layers().is_empty() {
        return Err(err("the image manifest has no layers"));
    }
    for layer in manifest.layers() {
        let blob = Blob { layout: &root, descriptor: layer };
        let media = layer.media_type().to_string();
        let compression = if media.ends_with("tar+gzip") || media.ends_with("tar.gzip") {
            Compression::Gzip
        } else if media.ends_with("tar") {
            Compression::None
        } else {
            return Err(err(format!("layer {}: media type {media} is not a tar or gzip layer", blob.name())));
        };
        // Two verified passes: the whiteouts against the lower layers, then
        // the entries.
        blob.read_through(compression, |r| layers::apply_whiteouts(dest, r))?;
        blob.read_through(compression, |r| layers::extract(dest, r, report))?;
    }
    Ok(())
}
