//! Content digests of files pvisor stages, applies, checkpoints and
//! archives, and the sparse-aware copy that goes with them.
//!
//! The digest is plain BLAKE3 of the contents (what `b3sum` prints) for
//! every file that has no all-zero [`BLOCK`]-aligned block. A file that has
//! one (a sparse file, a disk image, a preallocated database) is hashed in a
//! separate BLAKE3 domain ([`SPARSE_CONTEXT`]) over its length and its
//! blocks, each all-zero run given as a count instead of its bytes. Holes
//! are found with `SEEK_DATA`/`SEEK_HOLE` and never read, so a 20 GiB file
//! that is all hole hashes in microseconds instead of the 100 s it takes to
//! feed 20 GiB of zeros to BLAKE3. The digest depends on the contents alone:
//! a hole and written zeros hash the same, so a sparse file and its dense
//! copy agree. The two domains cannot collide (BLAKE3 derive-key mode).
//!
//! Every content digest in pvisor comes from here; one that did not would
//! disagree with these on exactly the files this exists for.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// The unit of zero detection: a block is skipped only if it is all zero.
pub const BLOCK: usize = 64 * 1024;

/// The BLAKE3 derive-key context of the sparse encoding.
pub const SPARSE_CONTEXT: &str = "pvisor 2026-12-01 content digest with zero runs v1";

/// Something whose contents can be read at any offset: a file, or bytes.
pub trait Contents {
    /// The length in bytes (named for what it is, not a collection's `len`).
    fn size(&self) -> io::Result<u64>;
    /// Fills `buf` from `offset` (short only at the end).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// The start of the next data at or after `offset` (`None`: only holes
    /// follow). Contents without holes answer `Some(offset)`.
    fn next_data(&self, offset: u64) -> io::Result<Option<u64>> {
        Ok(Some(offset))
    }
    /// The end of the data that starts at `offset` (the next hole).
    fn next_hole(&self, _offset: u64) -> io::Result<u64> {
        self.size()
    }
}

impl Contents for File {
    fn size(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut filled = 0;
        while filled < buf.len() {
            match FileExt::read_at(self, &mut buf[filled..], offset + filled as u64) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(filled)
    }

    fn next_data(&self, offset: u64) -> io::Result<Option<u64>> {
        match seek(self, rustix::fs::SeekFrom::Data(offset))? {
            Seek::At(at) => Ok(Some(at)),
            Seek::Past => Ok(None),
            Seek::Unsupported => Ok(Some(offset)),
        }
    }

    fn next_hole(&self, offset: u64) -> io::Result<u64> {
        match seek(self, rustix::fs::SeekFrom::Hole(offset))? {
            Seek::At(at) => Ok(at),
            Seek::Past | Seek::Unsupported => self.size(),
        }
    }
}

enum Seek {
    At(u64),
    /// `ENXIO`: nothing of the kind at or after the offset.
    Past,
    /// The filesystem has no `SEEK_DATA`/`SEEK_HOLE`: everything is data.
    Unsupported,
}

fn seek(file: &File, pos: rustix::fs::SeekFrom) -> io::Result<Seek> {
    use rustix::io::Errno;
    // pread ignores the file offset this moves.
    match rustix::fs::seek(file, pos) {
        Ok(at) => Ok(Seek::At(at)),
        Err(Errno::NXIO) => Ok(Seek::Past),
        Err(Errno::INVAL | Errno::OPNOTSUPP) => Ok(Seek::Unsupported),
        Err(e) => Err(e.into()),
    }
}

impl Contents for [u8] {
    fn size(&self) -> io::Result<u64> {
        Ok(self.len() as u64)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let start = (offset as usize).min(<[u8]>::len(self));
        let n = buf.len().min(<[u8]>::len(self) - start);
        buf[..n].copy_from_slice(&self[start..start + n]);
        Ok(n)
    }
}

/// One [`BLOCK`] of contents, in order.
#[derive(Debug)]
pub enum Block<'a> {
    /// `len` bytes of zeros (a hole, or zeros that were read).
    Zero(u64),
    Data(&'a [u8]),
}

/// Calls `each` with every block of `contents`, in order, skipping holes
/// without reading them.
pub fn blocks(
    contents: &(impl Contents + ?Sized),
    each: impl FnMut(u64, Block<'_>) -> io::Result<()>,
) -> io::Result<()> {
    blocks_of(contents, contents.size()?, each)
}

/// [`blocks`] of contents whose length the caller already knows.
fn blocks_of(
    contents: &(impl Contents + ?Sized),
    len: u64,
    mut each: impl FnMut(u64, Block<'_>) -> io::Result<()>,
) -> io::Result<()> {
    // One block at most: read it, no need to ask where the holes are (most
    // files a command writes are this small; two lseeks each add up).
    if len <= BLOCK as u64 {
        let mut buf = vec![0u8; len as usize];
        if contents.read_at(&mut buf, 0)? as u64 != len {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the contents shrank while being read"));
        }
        return match len {
            0 => Ok(()),
            _ if is_zero(&buf) => each(0, Block::Zero(len)),
            _ => each(0, Block::Data(&buf)),
        };
    }
    let mut buf = vec![0u8; BLOCK];
    let mut offset = 0u64;
    // The data extent at or after `offset`: [data_start, data_end).
    let (mut data_start, mut data_end) = (0u64, 0u64);
    while offset < len {
        let this = (len - offset).min(BLOCK as u64);
        if offset >= data_end {
            data_start = contents.next_data(offset)?.unwrap_or(len);
            data_end =
                if data_start < len { contents.next_hole(data_start)?.max(data_start + 1) } else { len };
        }
        if data_start >= offset + this {
            // The whole block is a hole.
            each(offset, Block::Zero(this))?;
            offset += this;
            continue;
        }
        let n = contents.read_at(&mut buf[..this as usize], offset)?;
        if n as u64 != this {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the contents shrank while being read"));
        }
        let block = &buf[..n];
        if is_zero(block) {
            each(offset, Block::Zero(this))?;
        } else {
            each(offset, Block::Data(block))?;
        }
        offset += this;
    }
    Ok(())
}

fn is_zero(block: &[u8]) -> bool {
    // Eight bytes at a time: the loads need no alignment, and this runs on
    // every block hashed or copied.
    let words = block.chunks_exact(8);
    let tail = words.remainder();
    words.fold(0u64, |acc, w| acc | u64::from_ne_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]])) == 0
        && tail.iter().all(|&b| b == 0)
}

/// The digest of `contents` (see the module docs), as lowercase hex.
pub fn digest(contents: &(impl Contents + ?Sized)) -> io::Result<String> {
    let len = contents.size()?;
    let mut hasher = Digester::new(len);
    blocks_of(contents, len, |offset, block| hasher.block(contents, offset, block))?;
    Ok(hasher.finish())
}

/// Digest of bytes in memory.
pub fn digest_bytes(bytes: &[u8]) -> String {
    // Reading from memory cannot fail.
    digest(bytes).unwrap_or_default()
}

/// Copies `from` into the empty file `to`, leaving every all-zero block a
/// hole, and returns the digest of what was copied.
pub fn copy_sparse(from: &(impl Contents + ?Sized), to: &File) -> io::Result<String> {
    let len = from.size()?;
    let mut hasher = Digester::new(len);
    let mut written_to = 0;
    let unit = fs_block(to);
    blocks_of(from, len, |offset, block| {
        if let Block::Data(data) = &block {
            // Only the filesystem blocks that hold data are written: a
            // [`BLOCK`] with one 4 KiB block of data in it costs 4 KiB on
            // disk, not 64.
            for (start, end) in data_runs(data, unit) {
                to.write_all_at(&data[start..end], offset + start as u64)?;
                written_to = offset + end as u64;
            }
        }
        hasher.block(from, offset, block)
    })?;
    // Only a trailing hole leaves the file short of its length.
    if written_to < len {
        to.set_len(len)?;
    }
    Ok(hasher.finish())
}

/// The filesystem block size of `to` (a power of two dividing [`BLOCK`]).
fn fs_block(to: &File) -> usize {
    use std::os::unix::fs::MetadataExt;
    let size = to.metadata().map_or(4096, |m| m.blksize() as usize);
    if size.is_power_of_two() && (512..=BLOCK).contains(&size) {
        size
    } else {
        4096
    }
}

/// The byte ranges of `data` made of `unit`-sized pieces that are not all
/// zero, adjacent pieces joined.
fn data_runs(data: &[u8], unit: usize) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for (i, piece) in data.chunks(unit).enumerate() {
        if is_zero(piece) {
            continue;
        }
        let (start, end) = (i * unit, i * unit + piece.len());
        match runs.last_mut() {
            Some(last) if last.1 == start => last.1 = end,
            _ => runs.push((start, end)),
        }
    }
    runs
}

/// Makes the empty file `to` share `from`'s extents (`FICLONE`): a copy
/// in constant time where the filesystem can (XFS with reflink, btrfs). False
/// where it cannot (ext4, tmpfs, two filesystems); nothing was written then.
pub fn reflink(from: &File, to: &File) -> bool {
    rustix::fs::ioctl_ficlone(to, from).is_ok()
}

/// The hashing state: plain BLAKE3 until the first zero block, then the
/// sparse encoding (which re-reads the blocks before it, once).
struct Digester {
    len: u64,
    plain: Option<blake3::Hasher>,
    sparse: Option<blake3::Hasher>,
    zero_run: u64,
}

impl Digester {
    fn new(len: u64) -> Self {
        Self { len, plain: Some(blake3::Hasher::new()), sparse: None, zero_run: 0 }
    }

    fn block(
        &mut self,
        contents: &(impl Contents + ?Sized),
        offset: u64,
        block: Block<'_>,
    ) -> io::Result<()> {
        match (block, &mut self.plain) {
            (Block::Data(data), Some(plain)) => {
                plain.update(data);
            }
            (Block::Zero(n), Some(_)) => {
                self.plain = None;
                let mut sparse = blake3::Hasher::new_derive_key(SPARSE_CONTEXT);
                sparse.update(&self.len.to_le_bytes());
                self.sparse = Some(sparse);
                // The blocks before this one had data; hash them again in the
                // sparse encoding.
                let mut buf = vec![0u8; BLOCK];
                let mut at = 0;
                while at < offset {
                    let want = (offset - at).min(BLOCK as u64) as usize;
                    let got = contents.read_at(&mut buf[..want], at)?;
                    if got != want {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "the contents shrank while being read",
                        ));
                    }
                    self.data(&buf[..got]);
                    at += got as u64;
                }
                self.zero_run = n;
            }
            (Block::Data(data), None) => self.data(data),
            (Block::Zero(n), None) => self.zero_run += n,
        }
        Ok(())
    }

    fn data(&mut self, data: &[u8]) {
        let Some(sparse) = &mut self.sparse else { return };
        if self.zero_run > 0 {
            sparse.update(b"Z");
            sparse.update(&self.zero_run.to_le_bytes());
            self.zero_run = 0;
        }
        sparse.update(b"D");
        sparse.update(data);
    }

    fn finish(mut self) -> String {
        if let Some(plain) = self.plain {
            return plain.finalize().to_hex().to_string();
        }
        let run = self.zero_run;
        let mut sparse = self.sparse.take().unwrap_or_else(|| blake3::Hasher::new_derive_key(SPARSE_CONTEXT));
        if run > 0 {
            sparse.update(b"Z");
            sparse.update(&run.to_le_bytes());
        }
        sparse.finalize().to_hex().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_without_zero_blocks_hash_as_plain_blake3() {
        let bytes: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8 + 1).collect();
        assert_eq!(digest_bytes(&bytes), blake3::hash(&bytes).to_hex().to_string());
        assert_eq!(digest_bytes(b""), blake3::hash(b"").to_hex().to_string());
    }

    #[test]
    fn a_hole_and_written_zeros_agree_and_differ_from_other_contents() {
        let dir = tempfile::tempdir().unwrap();
        let dense_path = dir.path().join("dense");
        let sparse_path = dir.path().join("sparse");
        let mut contents = vec![0u8; 5 * BLOCK + 123];
        contents[10] = 7;
        contents[4 * BLOCK + 5] = 9;
        std::fs::write(&dense_path, &contents).unwrap();
        let sparse = File::options().create_new(true).write(true).read(true).open(&sparse_path).unwrap();
        sparse.write_all_at(&[7], 10).unwrap();
        sparse.write_all_at(&[9], 4 * BLOCK as u64 + 5).unwrap();
        sparse.set_len(contents.len() as u64).unwrap();
        let dense = File::open(&dense_path).unwrap();
        let d = digest(&dense).unwrap();
        assert_eq!(d, digest(&sparse).unwrap());
        assert_eq!(d, digest_bytes(&contents));
        assert_ne!(d, blake3::hash(&contents).to_hex().to_string(), "zero blocks use the sparse domain");
        contents[3 * BLOCK] = 1;
        assert_ne!(d, digest_bytes(&contents));
        // Same data, different length of trailing zeros: different digests.
        let mut longer = contents.clone();
        longer.extend_from_slice(&[0u8; BLOCK]);
        assert_ne!(digest_bytes(&contents), digest_bytes(&longer));
    }

    #[test]
    fn a_sparse_copy_keeps_holes_and_contents() {
        let dir = tempfile::tempdir().unwrap();
        let from_path = dir.path().join("from");
        let from = File::options().create_new(true).write(true).read(true).open(&from_path).unwrap();
        from.write_all_at(b"head", 0).unwrap();
        from.write_all_at(b"tail", (1 << 30) - 4).unwrap();
        let to_path = dir.path().join("to");
        let to = File::options().create_new(true).write(true).read(true).open(&to_path).unwrap();
        let d = copy_sparse(&from, &to).unwrap();
        assert_eq!(d, digest(&from).unwrap());
        assert_eq!(d, digest(&to).unwrap());
        use std::os::unix::fs::MetadataExt;
        let meta = to.metadata().unwrap();
        assert_eq!(meta.len(), 1 << 30);
        assert!(meta.blocks() * 512 < 1 << 20, "the copy is not sparse: {} blocks", meta.blocks());
    }

    #[test]
    fn a_sparse_copy_writes_only_the_filesystem_blocks_that_hold_data() {
        let dir = tempfile::tempdir().unwrap();
        let from =
            File::options().create_new(true).write(true).read(true).open(dir.path().join("f")).unwrap();
        // One 4 KiB block of data at the start of each of 64 [`BLOCK`]s.
        for i in 0..64u64 {
            from.write_all_at(&[1u8; 4096], i * BLOCK as u64).unwrap();
        }
        from.set_len(64 * BLOCK as u64).unwrap();
        let to = File::options().create_new(true).write(true).read(true).open(dir.path().join("t")).unwrap();
        assert_eq!(copy_sparse(&from, &to).unwrap(), digest(&from).unwrap());
        use std::os::unix::fs::MetadataExt;
        let used = to.metadata().unwrap().blocks() * 512;
        assert!(used <= 2 * 64 * 4096, "{used} bytes on disk for 256 KiB of data");
    }
}
