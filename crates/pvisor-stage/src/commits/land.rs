//! Checking a staged commit against the host repository, then landing it.
//!
//! [`verify`] copies the staged objects and packs into a quarantine git
//! directory whose alternate is the host's object store, and asks git there:
//! does each ref name an object of the right type, is its whole history
//! present (`rev-list --objects`, which fails on a missing object), is the
//! host's current value an ancestor of it (fast-forward only; a tag never
//! moves), and do the new objects hash to their names and pass `index-pack
//! --strict` (git's fsck checks)? Before any of that, every staged object
//! is authenticated: loose objects are re-packed and re-indexed on their
//! own, staged packs are indexed afresh (a staged `.idx` is never read), so
//! no staged object can pose as one the host holds or lie about its type or
//! parents. [`Checked::tree_changes`] lists what the commit changes in the
//! work tree, for the caller to judge as it judges staged files. Nothing is
//! written to the host.
//! [`Checked::land`] then writes the checked pack into the host with `git
//! index-pack` (objects first: content-addressed, so a repeat is harmless)
//! and moves each ref with `git update-ref NAME NEW OLD` (a compare-and-swap
//! that also writes the reflog) last. The staged index is never copied: the
//! host index follows the branch only if it still matched the old commit.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use std::os::unix::ffi::OsStrExt;

use pvisor_core::records::{ChangeEntry, ChangeKind, EntryType};
use pvisor_core::store::RelPath;

use super::git::{Git, Ran};
use super::{role, Role, Staged, GIT_DIR};
use crate::beneath::Root;

/// Why a commit could not be checked or landed (an operation failed; a
/// commit that is no fast-forward is a [`Refusal`], not an error).
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    #[error("Cannot {op} {}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("Staged {} is over {max} bytes; a ref file is a line", path.display())]
    TooLarge { path: PathBuf, max: u64 },
    #[error("`git {command}` failed in {}: {stderr}; is git installed and the repository readable?", git_dir.display())]
    Git { command: String, git_dir: PathBuf, stderr: String },
}

impl CommitError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Self::Io { op, path: path.into(), source }
    }
}

/// A branch or tag to move: `old` is the host's value now (`None`: the
/// host has no such ref), `new` the sandbox's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefMove {
    pub name: String,
    pub old: Option<String>,
    pub new: String,
    /// The staged change it came from (index into the list given to [`verify`]).
    pub change: usize,
}

impl RefMove {
    /// `refs/heads/main 1a2b3c4..5d6e7f8` (`0000000..` for a new ref).
    pub fn summary(&self) -> String {
        let old = self.old.as_deref().map_or("0000000", short);
        format!("{} {old}..{}", self.name, short(&self.new))
    }
}

/// The first seven digits of a hash, as git abbreviates it.
pub fn short(hash: &str) -> &str {
    &hash[..hash.len().min(7)]
}

/// A ref that cannot land, and why: the whole apply is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub name: String,
    pub change: usize,
    pub reason: String,
}

/// A staged commit checked against the host: what would move, what the
/// host already holds, what cannot land. Holds the quarantine until landed.
#[derive(Debug)]
pub struct Checked {
    pub moves: Vec<RefMove>,
    /// Refs the host already holds at the sandbox's value (an earlier apply).
    pub already: Vec<RefMove>,
    pub refused: Vec<Refusal>,
    /// Every change that lands (or is settled) with the commit.
    pub members: Vec<usize>,
    /// How many objects the host lacks.
    pub new_objects: usize,
    /// What the moves change in the work tree, once checked out.
    pub tree_changes: Vec<ChangeEntry>,
    host: Git,
    _quarantine: tempfile::TempDir,
    pack: Option<PathBuf>,
}

/// What [`Checked::land`] did.
#[derive(Debug, Default)]
pub struct Landed {
    pub moved: Vec<RefMove>,
    /// Refs whose compare-and-swap failed (the host moved them meanwhile).
    pub failed: Vec<(RefMove, String)>,
    pub warnings: Vec<String>,
}

/// Checks `staged` (found among `changes` in the stage `upper`) against the
/// repository at `workspace/.git`, in a quarantine made under `scratch`.
pub fn verify(
    workspace: &Path,
    upper: &Root,
    changes: &[ChangeEntry],
    staged: Staged,
    scratch: &Path,
) -> Result<Checked, CommitError> {
    let git_dir = workspace.join(GIT_DIR);
    let host = Git::at(&git_dir);
    let quarantine = tempfile::Builder::new()
        .prefix("commit-check-")
        .tempdir_in(scratch)
        .map_err(|e| CommitError::io("create a quarantine in", scratch, e))?;
    make_quarantine(&host, quarantine.path())?;
    let forged = authenticate(upper, changes, &staged.members, quarantine.path())?;
    let q = Git::quarantine(quarantine.path(), &git_dir.join("objects"));
    let host_refs = host_refs(&host)?;
    let mut checked = Checked {
        moves: Vec::new(),
        already: Vec::new(),
        refused: Vec::new(),
        members: staged.members,
        new_objects: 0,
        tree_changes: Vec::new(),
        host,
        _quarantine: quarantine,
        pack: None,
    };
    if let Err(reason) = forged {
        let refused = staged.refs.into_iter().map(|r| Refusal {
            name: r.name,
            change: r.change,
            reason: reason.clone(),
        });
        checked.refused.extend(refused);
        return Ok(checked);
    }
    for staged_ref in staged.refs {
        let old = host_refs.get(&staged_ref.name).cloned();
        let change = staged_ref.change;
        let mv = RefMove { name: staged_ref.name, old, new: staged_ref.new, change };
        if mv.old.as_deref() == Some(mv.new.as_str()) {
            // `packed-refs` lists every ref `git gc` packed (deleting its
            // loose file), moved or not: one the host holds as it is there
            // is no part of the commit. A loose ref the sandbox wrote is.
            if changes[change].entry == EntryType::File
                && role(changes[change].path.as_path(), EntryType::File) == Role::Ref
            {
                checked.already.push(mv);
            }
        } else if let Some(reason) = case_twin(&mv, &host_refs) {
            checked.refused.push(Refusal { name: mv.name.clone(), change, reason });
        } else if let Some(reason) = why_not(&q, &mv)? {
            checked.refused.push(Refusal { name: mv.name.clone(), change, reason });
        } else {
            checked.moves.push(mv);
        }
    }
    if !checked.moves.is_empty() {
        let q_dir = checked._quarantine.path().to_path_buf();
        match pack_new_objects(&q, &q_dir, &checked.moves, &host_refs)? {
            Ok((pack, count)) => (checked.pack, checked.new_objects) = (pack, count),
            Err(reason) => {
                let refused = checked.moves.drain(..).map(|m| Refusal {
                    name: m.name,
                    change: m.change,
                    reason: reason.clone(),
                });
                checked.refused.extend(refused);
            }
        }
    }
    checked.tree_changes = tree_changes(&q, &checked.host, &checked.moves)?;
    Ok(checked)
}

/// An empty git directory at `dir` with the host's object format.
#[allow(clippy::disallowed_methods)] // a scratch git directory removed after the check, not a record
fn make_quarantine(host: &Git, dir: &Path) -> Result<(), CommitError> {
    let format = run_ok(host, &["rev-parse", "--show-object-format"], None)?;
    let format = String::from_utf8_lossy(&format.stdout).trim().to_owned();
    let config = if format == "sha1" || format.is_empty() {
        "[core]\n\trepositoryformatversion = 0\n".to_owned()
    } else {
        format!("[core]\n\trepositoryformatversion = 1\n[extensions]\n\tobjectformat = {format}\n")
    };
    let io = |e| CommitError::io("create the quarantine", dir, e);
    fs::create_dir_all(dir.join("objects/pack")).map_err(io)?;
    fs::create_dir_all(dir.join("refs")).map_err(io)?;
    fs::write(dir.join("HEAD"), "ref: refs/heads/quarantine\n").map_err(io)?;
    fs::write(dir.join("config"), config).map_err(io)?;
    Ok(())
}

/// Copies the staged objects among `members` into the quarantine `dir`
/// (read confined to the stage) and checks that each is what its name
/// says. Loose objects come first, checked alone: re-packed and indexed
/// afresh, every name must come back. Then each staged pack, indexed afresh
/// (its staged `.idx` is never copied). `Ok(Err(reason))` for a forgery.
fn authenticate(
    upper: &Root,
    changes: &[ChangeEntry],
    members: &[usize],
    dir: &Path,
) -> Result<Result<(), String>, CommitError> {
    let staged_only = Git::at(dir);
    let of_role = |want: Role, suffix: &'static str| {
        members.iter().map(|&i| &changes[i]).filter(move |c| {
            c.entry == EntryType::File
                && role(c.path.as_path(), c.entry) == want
                && c.path.as_path().as_os_str().as_bytes().ends_with(suffix.as_bytes())
        })
    };
    let mut loose = Vec::new();
    for change in of_role(Role::Object, "") {
        let rel = change.path.as_path();
        copy_staged(upper, rel, dir)?;
        let name = rel.strip_prefix(".git/objects").unwrap_or(rel).as_os_str().as_bytes();
        loose.push(String::from_utf8_lossy(name).replace('/', ""));
    }
    if let Err(reason) = loose_objects_hash_to_their_names(&staged_only, dir, &loose)? {
        return Ok(Err(reason));
    }
    for change in of_role(Role::Pack, ".pack") {
        let rel = change.path.as_path();
        let pack = copy_staged(upper, rel, dir)?;
        let pack_arg = pack.to_string_lossy().into_owned();
        let indexed = run(&staged_only, &["index-pack", &pack_arg], None)?;
        if !indexed.ok {
            return Ok(Err(format!(
                "the staged pack {} is not a valid pack ({})",
                rel.display(),
                indexed.stderr
            )));
        }
    }
    Ok(Ok(()))
}

/// Copies the staged `rel` (under `.git/`) to the same place in `dir`.
fn copy_staged(upper: &Root, rel: &Path, dir: &Path) -> Result<PathBuf, CommitError> {
    let inside = rel.strip_prefix(GIT_DIR).unwrap_or(rel);
    let target = dir.join(inside);
    if let Some(parent) = target.parent() {
        fs::create_dir_all(parent).map_err(|e| CommitError::io("create", parent, e))?;
    }
    let mut from = upper.open_file(rel).map_err(|e| CommitError::io("read the staged", rel, e))?;
    let mut to = File::create(&target).map_err(|e| CommitError::io("create", &target, e))?;
    io::copy(&mut from, &mut to).map_err(|e| CommitError::io("copy the staged", rel, e))?;
    Ok(target)
}

/// Packs the loose objects `names` (the quarantine holding nothing else
/// yet) and indexes the pack: `index-pack` names each object by hashing
/// its content, so a name that does not come back was forged.
fn loose_objects_hash_to_their_names(
    staged_only: &Git,
    dir: &Path,
    names: &[String],
) -> Result<Result<(), String>, CommitError> {
    if names.is_empty() {
        return Ok(Ok(()));
    }
    let pack = dir.join("loose-check.pack");
    let file = File::create(&pack).map_err(|e| CommitError::io("create", &pack, e))?;
    let input = names.join("\n") + "\n";
    let packed = staged_only
        .run_into(&["pack-objects", "--stdout"], input.as_bytes(), file)
        .map_err(spawn(staged_only))?;
    if !packed.ok {
        return Ok(Err(format!("the staged loose objects could not be read ({})", packed.stderr)));
    }
    let held = indexed_names(staged_only, &pack, &[])?;
    let _ = fs::remove_file(&pack);
    let _ = fs::remove_file(pack.with_extension("idx"));
    Ok(match held {
        // Two names for one content (a copy under a host object's name) end here.
        Err(stderr) => Err(format!("the staged loose objects are forged or corrupt ({stderr})")),
        Ok(held) => match names.iter().find(|n| !held.contains(*n)) {
            Some(forged) => Err(format!("the staged object {} does not hash to its name", short(forged))),
            None => Ok(()),
        },
    })
}

/// The names `index-pack FLAGS` gives the objects of `pack` (hashing
/// each), or what it said when it would not index it.
fn indexed_names(
    git: &Git,
    pack: &Path,
    flags: &[&str],
) -> Result<Result<BTreeSet<String>, String>, CommitError> {
    let pack_arg = pack.to_string_lossy().into_owned();
    let mut args = vec!["index-pack"];
    args.extend(flags);
    args.push(&pack_arg);
    let indexed = run(git, &args, None)?;
    if !indexed.ok {
        return Ok(Err(indexed.stderr));
    }
    let idx = pack.with_extension("idx");
    let index = File::open(&idx).map_err(|e| CommitError::io("read", &idx, e))?;
    let shown = git.run_from(&["show-index"], index).map_err(spawn(git))?;
    Ok(Ok(String::from_utf8_lossy(&shown.stdout)
        .lines()
        .filter_map(|l| l.split(' ').nth(1).map(str::to_owned))
        .collect()))
}

/// What `moves` change in the work tree: `git diff-tree` from each ref's
/// host value (for a new ref: the host's `HEAD`, or nothing) to its new
/// commit, as changes a caller can judge as it judges staged files.
fn tree_changes(q: &Git, host: &Git, moves: &[RefMove]) -> Result<Vec<ChangeEntry>, CommitError> {
    let head = run(host, &["rev-parse", "-q", "--verify", "HEAD^{commit}"], None)?;
    let head = head.ok.then(|| String::from_utf8_lossy(&head.stdout).trim().to_owned());
    let mut out: BTreeMap<PathBuf, ChangeEntry> = BTreeMap::new();
    for mv in moves {
        let new = format!("{}^{{commit}}", mv.new);
        let base = mv.old.clone().or_else(|| head.clone()).map(|b| format!("{b}^{{commit}}"));
        let args: Vec<&str> = match &base {
            Some(base) => vec!["diff-tree", "-r", "--no-renames", "-z", base, &new],
            None => vec!["diff-tree", "-r", "--no-renames", "--root", "-z", &new],
        };
        let listed = run_ok(q, &args, None)?;
        for change in parse_raw_diff(&listed.stdout) {
            out.insert(change.path.as_path().to_path_buf(), change);
        }
    }
    Ok(out.into_values().collect())
}

/// `git diff-tree -r -z` output (`:OLDMODE NEWMODE OLD NEW STATUS\0PATH\0`
/// records; `--root` puts the commit's own hash first) as changes; a
/// submodule (gitlink) is [`EntryType::Special`].
pub(crate) fn parse_raw_diff(raw: &[u8]) -> Vec<ChangeEntry> {
    let mut out = Vec::new();
    let mut fields = raw.split(|&b| b == 0).filter(|f| !f.is_empty());
    while let Some(head) = fields.next() {
        let Some(meta) = head.strip_prefix(b":") else { continue };
        let Some(path) = fields.next() else { break };
        let parts: Vec<&[u8]> = meta.split(|&b| b == b' ').collect();
        let (Some(new_mode), Some(status)) = (parts.get(1), parts.get(4)) else { continue };
        let mode = u32::from_str_radix(&String::from_utf8_lossy(new_mode), 8).unwrap_or(0);
        let (kind, entry) = match (status.first(), mode & 0o170000) {
            (Some(b'D'), _) => (ChangeKind::Deleted, EntryType::None),
            // A submodule's commit (a gitlink): no file of this tree.
            (Some(b'A'), 0o160000) => (ChangeKind::Added, EntryType::Special),
            (_, 0o160000) => (ChangeKind::Modified, EntryType::Special),
            (Some(b'A'), 0o120000) => (ChangeKind::Added, EntryType::Symlink),
            (Some(b'A'), _) => (ChangeKind::Added, EntryType::File),
            (_, 0o120000) => (ChangeKind::Modified, EntryType::Symlink),
            _ => (ChangeKind::Modified, EntryType::File),
        };
        let path = RelPath::new(Path::new(std::ffi::OsStr::from_bytes(path)));
        out.push(ChangeEntry {
            path,
            kind,
            entry,
            size: 0,
            mode: mode & 0o7777,
            blake3: None,
            hardlink_of: None,
        });
    }
    out
}

/// The host's branches and tags: name → hash.
fn host_refs(host: &Git) -> Result<BTreeMap<String, String>, CommitError> {
    let out = run_ok(
        host,
        &["for-each-ref", "--format=%(objectname) %(refname)", "refs/heads", "refs/tags"],
        None,
    )?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(' ').map(|(hash, name)| (name.to_owned(), hash.to_owned())))
        .collect())
}

/// A new ref whose name differs from a host ref's only in case: on a
/// case-insensitive filesystem (casefold ext4, vfat, SMB) its loose file
/// would be the other's, moved without the fast-forward check.
fn case_twin(mv: &RefMove, host_refs: &BTreeMap<String, String>) -> Option<String> {
    if mv.old.is_some() {
        return None;
    }
    let twin = host_refs.keys().find(|name| name.eq_ignore_ascii_case(&mv.name) && **name != mv.name)?;
    Some(format!(
        "the sandbox made {}, which differs from the host's {twin} only in case: on a case-insensitive filesystem it would move {twin} unchecked",
        mv.name
    ))
}

/// Why `mv` cannot land (checked in the quarantine `q`), if it cannot.
fn why_not(q: &Git, mv: &RefMove) -> Result<Option<String>, CommitError> {
    let kind = run(q, &["cat-file", "-t", &mv.new], None)?;
    let kind = String::from_utf8_lossy(&kind.stdout).trim().to_owned();
    let tag = mv.name.starts_with("refs/tags/");
    if kind.is_empty() {
        return Ok(Some(format!(
            "the sandbox set {} to {}, an object neither the stage nor the host holds",
            mv.name,
            short(&mv.new)
        )));
    }
    if kind != "commit" && !(tag && kind == "tag") {
        return Ok(Some(format!(
            "the sandbox set {} to {}, a {kind}, not a commit",
            mv.name,
            short(&mv.new)
        )));
    }
    let Some(old) = &mv.old else { return Ok(None) };
    if tag {
        return Ok(Some(format!(
            "tag {} is {} on the host and the sandbox set it to {}; tags are never moved",
            mv.name,
            short(old),
            short(&mv.new)
        )));
    }
    let ancestor = run(q, &["merge-base", "--is-ancestor", old, &mv.new], None)?;
    Ok(match ancestor.code {
        Some(0) => None,
        Some(1) => Some(format!(
            "{} moved on the host since the run: it is {} now, and the sandbox's commit {} does not descend \
             from it (not a fast-forward)",
            mv.name,
            short(old),
            short(&mv.new)
        )),
        _ => return Err(git_error(q, "merge-base --is-ancestor", &ancestor)),
    })
}

/// Lists the objects the moves need that the host lacks (failing on any
/// missing one), packs them in the quarantine and checks the pack with
/// `index-pack --strict`, and that every object hashes to its name.
/// `Ok(Err(reason))` when the staged history is incomplete or invalid.
fn pack_new_objects(
    q: &Git,
    dir: &Path,
    moves: &[RefMove],
    host_refs: &BTreeMap<String, String>,
) -> Result<Result<(Option<PathBuf>, usize), String>, CommitError> {
    let mut args: Vec<&str> = vec!["rev-list", "--objects"];
    args.extend(moves.iter().map(|m| m.new.as_str()));
    let known: BTreeSet<&str> = host_refs.values().map(String::as_str).collect();
    if !known.is_empty() {
        args.push("--not");
        args.extend(known);
    }
    let listed = run(q, &args, None)?;
    if !listed.ok {
        return Ok(Err(format!("the staged history is incomplete ({})", listed.stderr)));
    }
    let names: BTreeSet<String> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .filter_map(|l| l.split(' ').next().map(str::to_owned))
        .filter(|h| !h.is_empty())
        .collect();
    if names.is_empty() {
        return Ok(Ok((None, 0)));
    }
    let pack = dir.join("land.pack");
    let file = File::create(&pack).map_err(|e| CommitError::io("create", &pack, e))?;
    let packed = q.run_into(&["pack-objects", "--stdout"], &listed.stdout, file).map_err(spawn(q))?;
    if !packed.ok {
        return Ok(Err(format!("the staged objects could not be read ({})", packed.stderr)));
    }
    // Objects are named by the hash of their content: one whose bytes do
    // not hash to its name is not the object the refs point to.
    let held = match indexed_names(q, &pack, &["--strict"])? {
        Ok(held) => held,
        Err(stderr) => return Ok(Err(format!("the staged objects are not valid git objects ({stderr})"))),
    };
    if let Some(missing) = names.iter().find(|n| !held.contains(*n)) {
        return Ok(Err(format!("the staged object {} does not hash to its name", short(missing))));
    }
    Ok(Ok((Some(pack), names.len())))
}

impl Checked {
    /// Lands the checked commit: the pack into the host's objects, then
    /// each ref by compare-and-swap (writing `message` to its reflog), then
    /// the index where it still matched the branch's old commit. `ws` is
    /// the workspace: run as root in a repository another user owns, what
    /// git wrote is handed to that user (see [`Owners`]).
    pub fn land(&self, ws: &Root, message: &str) -> Result<Landed, CommitError> {
        let owners = Owners::before(ws)?;
        let landed = self.land_as_is(message)?;
        if let Some(owners) = owners {
            owners.give_back(ws)?;
        }
        Ok(landed)
    }

    fn land_as_is(&self, message: &str) -> Result<Landed, CommitError> {
        let mut landed = Landed::default();
        if let Some(pack) = &self.pack {
            let file = File::open(pack).map_err(|e| CommitError::io("read", pack, e))?;
            let ran = self
                .host
                .run_from(&["index-pack", "--stdin", "--strict"], file)
                .map_err(spawn(&self.host))?;
            if !ran.ok {
                return Err(git_error(&self.host, "index-pack --stdin --strict", &ran));
            }
        }
        let head = run(&self.host, &["symbolic-ref", "-q", "HEAD"], None)?;
        let head = String::from_utf8_lossy(&head.stdout).trim().to_owned();
        for mv in &self.moves {
            let follow = mv.name == head && self.index_matches(mv.old.as_deref())?;
            let zero = "0".repeat(mv.new.len());
            let old = mv.old.as_deref().unwrap_or(&zero);
            let ran = run(&self.host, &["update-ref", "-m", message, &mv.name, &mv.new, old], None)?;
            if !ran.ok {
                landed.failed.push((mv.clone(), ran.stderr));
                continue;
            }
            if follow {
                self.follow_index(mv, &mut landed.warnings)?;
            } else if mv.name == head {
                landed.warnings.push(format!(
                    "{} moved, but the index held other staged changes and was left as it was; `git status` shows them",
                    mv.name
                ));
            }
            landed.moved.push(mv.clone());
        }
        Ok(landed)
    }

    /// Whether the host's index still holds exactly `old`'s tree (an
    /// unborn branch: an empty index).
    fn index_matches(&self, old: Option<&str>) -> Result<bool, CommitError> {
        match old {
            Some(old) => {
                Ok(run(&self.host, &["diff-index", "--cached", "--quiet", old, "--"], None)?.code == Some(0))
            }
            None => Ok(run_ok(&self.host, &["ls-files", "--stage"], None)?.stdout.is_empty()),
        }
    }

    /// Moves the index from the old commit's tree to the new one, keeping
    /// what git knows of the unchanged files (`read-tree -m -i`: the index
    /// only, never the work tree).
    fn follow_index(&self, mv: &RefMove, warnings: &mut Vec<String>) -> Result<(), CommitError> {
        let args: Vec<&str> = match &mv.old {
            Some(old) => vec!["read-tree", "-m", "-i", old, &mv.new],
            None => vec!["read-tree", &mv.new],
        };
        let ran = run(&self.host, &args, None)?;
        if !ran.ok {
            warnings.push(format!(
                "{} moved, but the index was not updated ({}); `git reset` updates it",
                mv.name, ran.stderr
            ));
        }
        Ok(())
    }
}

/// The owners of what git writes when a commit lands, before it does: run
/// as root in a repository another user owns, git's new files (a pack, a
/// ref, a reflog, the index) would be root's, and the user's own git could
/// no longer update them. Only entries root owns now and did not before are
/// given to the owner of `.git`, through the confined [`Root::chown`].
struct Owners {
    before: BTreeMap<PathBuf, u32>,
    owner: (u32, u32),
}

/// Where git writes when a commit lands.
const WRITTEN: [&str; 5] = [".git/objects/pack", ".git/refs", ".git/logs", ".git/index", ".git/packed-refs"];

impl Owners {
    /// `None` unless pvisor runs as root and `.git` belongs to someone else.
    fn before(ws: &Root) -> Result<Option<Self>, CommitError> {
        let git_dir = Path::new(GIT_DIR);
        let Some(st) = ws.stat(git_dir).map_err(|e| CommitError::io("inspect", git_dir, e))? else {
            return Ok(None);
        };
        if !rustix::process::geteuid().is_root() || st.uid == 0 {
            return Ok(None);
        }
        Ok(Some(Self { before: owned(ws)?, owner: (st.uid, st.gid) }))
    }

    fn give_back(&self, ws: &Root) -> Result<(), CommitError> {
        for (path, uid) in owned(ws)? {
            if uid == 0 && self.before.get(&path) != Some(&0) {
                ws.chown(&path, self.owner.0, self.owner.1)
                    .map_err(|e| CommitError::io("hand over", &path, e))?;
            }
        }
        Ok(())
    }
}

/// Every entry beneath [`WRITTEN`], with its owner (symlinks not followed).
fn owned(ws: &Root) -> Result<BTreeMap<PathBuf, u32>, CommitError> {
    let mut out = BTreeMap::new();
    let mut stack: Vec<PathBuf> = WRITTEN.iter().map(PathBuf::from).collect();
    while let Some(path) = stack.pop() {
        let Some(st) = ws.stat(&path).map_err(|e| CommitError::io("inspect", &path, e))? else { continue };
        if st.kind == crate::beneath::Kind::Dir {
            let names = ws.list(&path).map_err(|e| CommitError::io("list", &path, e))?;
            stack.extend(names.into_iter().map(|n| path.join(n)));
        }
        out.insert(path, st.uid);
    }
    Ok(out)
}

fn run(git: &Git, args: &[&str], input: Option<&[u8]>) -> Result<Ran, CommitError> {
    git.run(args, input).map_err(spawn(git))
}

fn run_ok(git: &Git, args: &[&str], input: Option<&[u8]>) -> Result<Ran, CommitError> {
    let ran = run(git, args, input)?;
    if ran.ok {
        Ok(ran)
    } else {
        Err(git_error(git, &args.join(" "), &ran))
    }
}

fn git_error(git: &Git, command: &str, ran: &Ran) -> CommitError {
    CommitError::Git {
        command: command.to_owned(),
        git_dir: git.dir().to_path_buf(),
        stderr: ran.stderr.clone(),
    }
}

fn spawn(git: &Git) -> impl Fn(io::Error) -> CommitError + '_ {
    move |e| CommitError::io("run git in", git.dir(), e)
}
