//! Commits made inside the sandbox: staged paths under the workspace's own
//! `.git/` that hold new objects and moved branch or tag refs land on apply
//! as a commit (the objects, then a compare-and-swap of each ref), never as
//! copied files.
//!
//! Boundary: this module decides which staged paths of the workspace's top
//! `.git/` directory make up a commit ([`find`], by [`role`]), checks that
//! commit against the host repository in a quarantine ([`verify`], in
//! `land.rs`) and lands it ([`Checked::land`]). It runs the host's `git`,
//! always through [`git::Git`]'s sanitised environment, and never reads the
//! staged config. Everything else under `.git/` (hooks, config, `info/`,
//! alternates, `HEAD`, other refs, a ref deleted) is no part of a commit: it
//! stays a sensitive change, applied only with consent, as before. Nested
//! repositories and a workspace whose `.git` is a file (a linked worktree)
//! are not handled here either.

use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use pvisor_core::records::{ChangeEntry, EntryType};

use crate::beneath::{Kind, Root};

pub(crate) mod git;
mod land;
#[cfg(test)]
mod tests;

pub use land::{verify, Checked, CommitError, Landed, RefMove, Refusal};

/// The git directory this module handles: the workspace's top `.git`.
pub const GIT_DIR: &str = ".git";

/// What a staged path under `.git/` is to a commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A loose object, `objects/xx/<hash>`: read into the quarantine.
    Object,
    /// A pack or its index, `objects/pack/pack-<hash>.{pack,idx}`: read into the quarantine.
    Pack,
    /// A branch or tag, `refs/heads/…` or `refs/tags/…`: moved by compare-and-swap.
    Ref,
    /// `packed-refs`: read for the values of branches and tags (`git gc` packs them).
    PackedRefs,
    /// What git derives again itself (reflogs, the index, `COMMIT_EDITMSG`,
    /// `ORIG_HEAD`, pack reverse indexes and bitmaps, commit graphs, the
    /// directories these live in): settled with the commit, never copied.
    Derived,
    /// Anything else (hooks, config, `info/`, alternates, `HEAD`, other
    /// refs): no part of a commit, a sensitive change as before.
    Other,
}

/// The role of `rel` (a workspace-relative staged path) staged as `entry`.
pub fn role(rel: &Path, entry: EntryType) -> Role {
    let Some(inner) = rel.as_os_str().as_bytes().strip_prefix(b".git/") else { return Role::Other };
    let parts: Vec<&[u8]> = inner.split(|&b| b == b'/').collect();
    let file = matches!(entry, EntryType::File | EntryType::None);
    let dir = matches!(entry, EntryType::Dir | EntryType::None);
    match parts.as_slice() {
        [b"objects"] | [b"objects", b"pack" | b"info"] | [b"refs"] | [b"logs"] if dir => Role::Derived,
        [b"objects", fan] if dir && is_hex(fan, 2) => Role::Derived,
        [b"objects", fan, name] if file && is_hex(fan, 2) && is_object_name(name) => Role::Object,
        [b"objects", b"pack", name] if file => pack_role(name),
        [b"objects", b"info", b"packs" | b"commit-graph"] if file => Role::Derived,
        [b"objects", b"info", b"commit-graphs", ..] => Role::Derived,
        [b"refs", b"heads" | b"tags", rest @ ..] if entry == EntryType::Dir && refname_ok(rest) => {
            Role::Derived
        }
        [b"refs", b"heads" | b"tags", rest @ ..] if file && !rest.is_empty() && refname_ok(rest) => Role::Ref,
        [b"logs", b"refs", b"heads" | b"tags", ..] | [b"logs", b"refs"] => Role::Derived,
        [b"logs", b"HEAD"] if file => Role::Derived,
        [b"packed-refs"] if entry == EntryType::File => Role::PackedRefs,
        [b"index" | b"COMMIT_EDITMSG" | b"ORIG_HEAD"] if file => Role::Derived,
        _ => Role::Other,
    }
}

fn pack_role(name: &[u8]) -> Role {
    let Some(rest) = name.strip_prefix(b"pack-") else {
        return if name == b"multi-pack-index" { Role::Derived } else { Role::Other };
    };
    let (hash, ext) = rest.split_at(rest.iter().position(|&b| b == b'.').unwrap_or(rest.len()));
    if !is_hex(hash, 40) && !is_hex(hash, 64) {
        return Role::Other;
    }
    match ext {
        b".pack" | b".idx" => Role::Pack,
        b".rev" | b".bitmap" | b".mtimes" | b".keep" | b".promisor" => Role::Derived,
        _ => Role::Other,
    }
}

fn is_hex(bytes: &[u8], len: usize) -> bool {
    bytes.len() == len && bytes.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The rest of a loose object's hash after its two-digit directory (SHA-1 or SHA-256).
fn is_object_name(name: &[u8]) -> bool {
    is_hex(name, 38) || is_hex(name, 62)
}

/// Whether each component below `refs/heads/` or `refs/tags/` is a plain
/// name git could have written (no lock files, no dot files, no control
/// characters); anything else is left to consent.
fn refname_ok(parts: &[&[u8]]) -> bool {
    parts.iter().all(|p| {
        !p.is_empty()
            && !p.starts_with(b".")
            && !p.ends_with(b".lock")
            && p.iter().all(|&b| b > b' ' && b != 0x7f && !b"~^:?*[\\".contains(&b))
    })
}

/// A branch or tag the sandbox set: its full name and the object it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagedRef {
    pub name: String,
    pub new: String,
    /// The change (index into the list given to [`find`]) the value came from.
    pub change: usize,
}

/// The staged commit: the changes it is made of and the refs it sets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Staged {
    /// Indices into the list given to [`find`]: every change that lands (or
    /// is settled) with the commit.
    pub members: Vec<usize>,
    pub refs: Vec<StagedRef>,
}

/// The longest ref or `packed-refs` file read from the stage.
const REF_FILE_MAX: u64 = 64 << 20;

/// The commit among `changes` (the remaining staged changes), if the
/// sandbox set at least one branch or tag. `ws` is the workspace, read to
/// see whether a loose ref shadows a packed one.
pub fn find(changes: &[ChangeEntry], ws: &Root, upper: &Root) -> Result<Option<Staged>, CommitError> {
    let roles: Vec<Role> = changes.iter().map(|c| role(c.path.as_path(), c.entry)).collect();
    let packed = match roles.iter().position(|r| *r == Role::PackedRefs) {
        Some(i) => Some((i, parse_packed(&read_small(upper, changes[i].path.as_path())?))),
        None => None,
    };
    let mut staged = Staged::default();
    for (i, change) in changes.iter().enumerate() {
        match roles[i] {
            Role::Other => continue,
            Role::Ref => match ref_value(upper, i, change, packed.as_ref())? {
                Some(r) => staged.refs.push(r),
                // A ref deleted, symbolic or unreadable: left to consent.
                None => continue,
            },
            Role::Object | Role::Pack | Role::PackedRefs | Role::Derived => {}
        }
        staged.members.push(i);
    }
    // Packed branches and tags no loose ref of the stage names.
    if let Some((i, values)) = &packed {
        for (name, new) in values {
            let loose = Path::new(GIT_DIR).join(name);
            let named = staged.refs.iter().any(|r| &r.name == name)
                || changes.iter().any(|c| c.path.as_path() == loose);
            let shadowed = ws.stat(&loose).map_err(|e| CommitError::io("inspect", &loose, e))?.is_some();
            if !named && !shadowed {
                staged.refs.push(StagedRef { name: name.clone(), new: new.clone(), change: *i });
            }
        }
    }
    staged.refs.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((!staged.refs.is_empty()).then_some(staged))
}

/// The value a staged loose ref (change `index`) gives its branch or tag:
/// the file's hash, or, for a loose ref the stage deleted (`git gc` packed
/// it), the staged `packed-refs` line. `None` for anything else (symbolic,
/// malformed, or deleted outright): that stays a change needing consent.
fn ref_value(
    upper: &Root,
    index: usize,
    change: &ChangeEntry,
    packed: Option<&(usize, Vec<(String, String)>)>,
) -> Result<Option<StagedRef>, CommitError> {
    let rel = change.path.as_path();
    let name = String::from_utf8_lossy(&rel.as_os_str().as_bytes()[GIT_DIR.len() + 1..]).into_owned();
    let new = if change.entry == EntryType::File {
        let bytes = read_small(upper, rel)?;
        let value = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
        (is_hex(value, 40) || is_hex(value, 64)).then(|| String::from_utf8_lossy(value).into_owned())
    } else {
        packed.and_then(|(_, values)| values.iter().find(|(n, _)| *n == name).map(|(_, v)| v.clone()))
    };
    Ok(new.map(|new| StagedRef { name, new, change: index }))
}

/// Reads a staged ref file (at most [`REF_FILE_MAX`] bytes), confined to the stage.
fn read_small(upper: &Root, rel: &Path) -> Result<Vec<u8>, CommitError> {
    let file = upper.open_file(rel).map_err(|e| CommitError::io("read the staged", rel, e))?;
    let meta = file.metadata().map_err(|e| CommitError::io("inspect the staged", rel, e))?;
    if meta.len() > REF_FILE_MAX {
        return Err(CommitError::TooLarge { path: rel.to_path_buf(), max: REF_FILE_MAX });
    }
    let mut bytes = Vec::new();
    file.take(REF_FILE_MAX)
        .read_to_end(&mut bytes)
        .map_err(|e| CommitError::io("read the staged", rel, e))?;
    Ok(bytes)
}

/// The branches and tags of a `packed-refs` file: `<hash> <name>` lines
/// (comments and `^` peeled lines skipped; other refs ignored).
pub fn parse_packed(bytes: &[u8]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for line in bytes.split(|&b| b == b'\n') {
        let Some(space) = line.iter().position(|&b| b == b' ') else { continue };
        let (hash, name) = (&line[..space], &line[space + 1..]);
        if !(is_hex(hash, 40) || is_hex(hash, 64)) {
            continue;
        }
        let Some(rest) = name.strip_prefix(b"refs/") else { continue };
        let parts: Vec<&[u8]> = rest.split(|&b| b == b'/').collect();
        if matches!(parts.first(), Some(&(b"heads" | b"tags"))) && parts.len() > 1 && refname_ok(&parts[1..])
        {
            out.push((
                String::from_utf8_lossy(name).into_owned(),
                String::from_utf8_lossy(hash).into_owned(),
            ));
        }
    }
    out
}

/// Whether the workspace's `.git` is a real directory (not a symlink, not a
/// file): only then does a staged commit have a repository to land in.
pub fn host_repository(ws: &Root) -> Result<bool, CommitError> {
    let rel = Path::new(GIT_DIR);
    Ok(ws.stat(rel).map_err(|e| CommitError::io("inspect", rel, e))?.is_some_and(|s| s.kind == Kind::Dir))
}

/// Whether the host has a `git` to check and land a commit with. Without
/// one, a staged commit's paths stay sensitive changes, as before.
pub fn git_available() -> bool {
    git::Git::at(Path::new("/")).run(&["--version"], None).is_ok_and(|ran| ran.ok)
}
