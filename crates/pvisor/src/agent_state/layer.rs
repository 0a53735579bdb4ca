//! A Job's copy of its agent state, in `<run>/agent-state/`, beside the
//! stage and never in it: how it is made before the run (carried from a
//! session's previous run, a promoted copy, or the host's), taken back from
//! the parent's overlay after it, compared for review, approved and promoted.
//!
//! Layout: `plan.json` (the paths, and the Job carried from); per path
//! `<slot>/tree` (the state itself: the directory, or a directory holding
//! the one file), `<slot>/start.json` (its manifest when the run started),
//! `<slot>/base/` (the gated entries as approved, to reset to),
//! `<slot>/pending/` and `pending.json` (gated changes held back, carried
//! until approved); `approved.json` (what the user approved, by path and
//! digest); `parents/<n>/{upper,work}` (the writable parents' overlays,
//! removed once single files are taken out). Promoted state lives in
//! `<state>/agent-state/<digest of the path>/tree`.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{chown, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use pvisor_core::ids::{JobId, RunId};
use pvisor_core::records::JobRecord;
use pvisor_core::store::{self, Store};
use pvisor_sandbox::StateMount;

use super::tree::{self, Manifest, ABSENT};
use super::{CheckedState, StateError, StateKind};

/// What a run's state is made of: the checked paths (slot = index) and
/// the session run it carries from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub paths: Vec<CheckedState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<JobId>,
}

/// One approval: the gated change at `path` whose content has `digest`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Approval {
    path: String,
    digest: String,
}

/// How a state entry changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StateChangeKind {
    Added,
    Modified,
    Deleted,
}

/// One change of agent state, as `review --state` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StateChange {
    pub path: String,
    pub change: StateChangeKind,
    /// A change that makes a later run execute something: carried only
    /// once approved.
    pub gated: bool,
    pub approved: bool,
    /// Made by an earlier run of the session and held back since.
    pub held: bool,
    #[serde(skip)]
    digest: String,
}

fn dir_of(store: &Store, run: &RunId) -> PathBuf {
    store.run_dir(run).join("agent-state")
}

fn promoted_dir(store: &Store, path: &Path) -> PathBuf {
    let digest = store::blake3_hex(path.as_os_str().as_encoded_bytes());
    store.root().join("agent-state").join(&digest[..16])
}

/// The tree of a slot, and the path in it that is the state path itself.
fn tree_of(slot: &Path, state: &CheckedState) -> (PathBuf, PathBuf) {
    let tree = slot.join("tree");
    let own = match state.kind {
        StateKind::Directory => tree.clone(),
        StateKind::File => tree.join(state.path.file_name().unwrap_or_default()),
    };
    (tree, own)
}

/// The absolute path of `rel` in the tree of `state`.
fn absolute(state: &CheckedState, rel: &str) -> String {
    let root = match state.kind {
        StateKind::Directory => state.path.clone(),
        StateKind::File => state.path.parent().map(Path::to_owned).unwrap_or_default(),
    };
    tree::join(&root, rel).to_string_lossy().into_owned()
}

/// The gated globs of `state`, compiled (admission checked each one).
fn globs(state: &CheckedState) -> Vec<pvisor_stage::glob::Pattern> {
    state.gated.iter().filter_map(|g| pvisor_stage::glob::Pattern::new(g).ok()).collect()
}

fn matches(globs: &[pvisor_stage::glob::Pattern], rel: &str) -> bool {
    globs.iter().any(|p| p.matches(rel.as_bytes()))
}

/// Whether `rel` is a gated path of `state` (for a few paths; a whole
/// tree compiles [`globs`] once).
fn is_gated(state: &CheckedState, rel: &str) -> bool {
    gated_entry(&globs(state), rel, None)
}

/// Whether the entry `rel` (as it is at `at`, when given) is gated: its
/// path matches a glob; or something that is not a directory sits where a
/// gated directory's entries are read (`hooks` as a file or symlink, for
/// `**/hooks/**`); or it is a symlink (it may lead a later read anywhere)
/// or an executable file (a status line script, a local install: what a
/// later run executes need not live under a gated name).
fn gated_entry(globs: &[pvisor_stage::glob::Pattern], rel: &str, at: Option<&Path>) -> bool {
    if matches(globs, rel) {
        return true;
    }
    let Some(meta) = at.and_then(|p| fs::symlink_metadata(p).ok()) else {
        return false;
    };
    !meta.is_dir() && (matches(globs, &format!("{rel}/_")) || meta.is_symlink() || meta.mode() & 0o111 != 0)
}

/// Whether `state` is a single JSON file whose gated keys, not the whole
/// file, are gated.
fn key_gated(state: &CheckedState) -> bool {
    state.kind == StateKind::File && !state.gated_keys.is_empty()
}

/// A JSON state document: a missing file is an empty object; `None` when
/// it is not a JSON object (gated whole then).
fn json_doc(path: &Path) -> Option<serde_json::Value> {
    // Never through a symlink the sandbox left (it could name any host file).
    if fs::symlink_metadata(path).is_ok_and(|m| !m.is_file()) {
        return None;
    }
    match fs::read(path) {
        Ok(bytes) => serde_json::from_slice::<serde_json::Value>(&bytes).ok().filter(|v| v.is_object()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(serde_json::json!({})),
        Err(_) => None,
    }
}

/// Whether the entry `rel` of `state`, now as at `candidate`, is a gated
/// change against the approved copy in `base`: a gated path, or a JSON
/// file whose gated keys differ (or that is not JSON).
fn gated_change(state: &CheckedState, base: &Path, rel: &str, candidate: &Path) -> bool {
    if gated_entry(&globs(state), rel, Some(candidate)) {
        return true;
    }
    if !key_gated(state) {
        // Gated at the start (kept in `base/`): whatever it became (made
        // plain, no longer executable, removed), the change is gated still.
        return fs::symlink_metadata(tree::join(base, rel)).is_ok();
    }
    match (json_doc(&tree::join(base, rel)), json_doc(candidate)) {
        (Some(approved), Some(now)) => super::json_keys::differ(&approved, &now, &state.gated_keys),
        _ => true,
    }
}

/// For a key-gated JSON file: rewrites `target` (the tree's current file)
/// with its gated keys as `from` has them, every other key as it is.
/// `false` (nothing done) for any other entry, or when either is not JSON:
/// then the whole file is what is kept or reset.
fn merge_keys(state: &CheckedState, rel: &str, from: &Path, target: &Path) -> std::io::Result<bool> {
    if !key_gated(state) || is_gated(state, rel) {
        return Ok(false);
    }
    let (Some(keys_from), Some(now)) = (json_doc(from), json_doc(target)) else { return Ok(false) };
    let merged = super::json_keys::reset(now, &keys_from, &state.gated_keys);
    let bytes = serde_json::to_vec_pretty(&merged).map_err(std::io::Error::other)?;
    tree::remove(target)?;
    store::write_atomic(target, &bytes).map_err(std::io::Error::other)?;
    Ok(true)
}

/// The distinct parents of the state paths, shallowest first.
fn parents(plan: &Plan) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for state in &plan.paths {
        let parent = state.path.parent().map(Path::to_owned).unwrap_or_default();
        if !out.contains(&parent) {
            out.push(parent);
        }
    }
    out.sort_by_key(|p| p.components().count());
    out
}

/// The mounts the executor makes for `plan` of `run`: each parent, then
/// each state directory.
pub(crate) fn mounts(store: &Store, run: &RunId, plan: &Plan) -> Vec<StateMount> {
    let dir = dir_of(store, run);
    let parents = parents(plan).into_iter().enumerate().map(|(n, path)| StateMount::Parent {
        upper: dir.join(format!("parents/{n}/upper")),
        work: dir.join(format!("parents/{n}/work")),
        path,
    });
    let dirs =
        plan.paths.iter().enumerate().filter(|(_, s)| s.kind == StateKind::Directory).map(|(slot, s)| {
            StateMount::Directory { path: s.path.clone(), tree: dir.join(slot.to_string()).join("tree") }
        });
    parents.chain(dirs).collect()
}

fn io<'a>(path: &'a Path, what: &'static str) -> impl FnOnce(std::io::Error) -> StateError + 'a {
    move |source| StateError::Io { path: path.to_owned(), what, source }
}

fn read_json<T: for<'de> Deserialize<'de> + Default>(path: &Path) -> Result<T, StateError> {
    match fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| StateError::Io {
            path: path.to_owned(),
            what: "cannot parse",
            source: std::io::Error::other(e),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(T::default()),
        Err(e) => Err(io(path, "cannot read")(e)),
    }
}

fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), StateError> {
    let bytes =
        serde_json::to_vec_pretty(value).map_err(|e| io(path, "cannot encode")(std::io::Error::other(e)))?;
    store::write_atomic(path, &bytes).map_err(|source| StateError::Record { path: path.to_owned(), source })
}

/// Makes every state path's tree for `run` before its sandbox starts (see
/// the module doc), the parents' uppers with each single file seeded in
/// them, and records the plan. `hidden` paths are never copied from the host.
pub(crate) fn prepare(store: &Store, run: &RunId, plan: &Plan, hidden: &[PathBuf]) -> Result<(), StateError> {
    if plan.paths.is_empty() {
        return Ok(());
    }
    let dir = dir_of(store, run);
    store::create_dir_all_private(&dir).map_err(|source| StateError::Record { path: dir.clone(), source })?;
    let previous = match &plan.from {
        Some(job) => previous_run(store, job)?,
        None => None,
    };
    for (slot, state) in plan.paths.iter().enumerate() {
        let slot_dir = dir.join(slot.to_string());
        let carried = previous.as_ref().and_then(|(prev_dir, prev_plan)| {
            let n = prev_plan.paths.iter().position(|p| p.path == state.path)?;
            Some((prev_dir.join(n.to_string()), prev_dir.join("approved.json")))
        });
        match carried {
            Some((prev_slot, approved)) => {
                let approved: Vec<Approval> = read_json(&approved)?;
                carry(&prev_slot, &approved, state, &slot_dir)?
            }
            None => start_fresh(store, state, &slot_dir, hidden)?,
        }
        record_start(state, &slot_dir)?;
    }
    seed_parents(&dir, plan)?;
    write_json(&dir.join("plan.json"), plan)
}

/// The agent-state directory and plan of `job`'s run, if it has state.
fn previous_run(store: &Store, job: &JobId) -> Result<Option<(PathBuf, Plan)>, StateError> {
    let file = store.job_file(job);
    let record: JobRecord =
        store.read(&file).map_err(|source| StateError::Record { path: file.clone(), source })?;
    let dir = dir_of(store, &record.run);
    let plan: Plan = read_json(&dir.join("plan.json"))?;
    Ok((!plan.paths.is_empty()).then_some((dir, plan)))
}

/// Whether `job` ran with agent state (its run recorded a plan).
pub fn has_state(store: &Store, job: &JobId) -> bool {
    previous_run(store, job).is_ok_and(|found| found.is_some())
}

/// A tree from the promoted copy, else from the host's own state (empty
/// when that is a secret store).
fn start_fresh(
    store: &Store,
    state: &CheckedState,
    slot: &Path,
    hidden: &[PathBuf],
) -> Result<(), StateError> {
    let (tree, own) = tree_of(slot, state);
    let promoted = promoted_dir(store, &state.path).join("tree");
    let skip = |p: &Path| hidden.iter().any(|h| p.starts_with(h));
    if promoted.is_dir() {
        // The promoted copy lives in the (hidden) state directory itself,
        // and held nothing hidden when it was made.
        return tree::copy_tree(&promoted, &tree, &|_| false)
            .map_err(io(&state.path, "cannot copy the promoted state"));
    }
    if state.secret_on_host {
        return fs::create_dir_all(&tree).map_err(io(&state.path, "cannot make its state"));
    }
    match state.kind {
        StateKind::Directory => tree::copy_tree(&state.path, &tree, &skip),
        StateKind::File => fs::create_dir_all(&tree).and_then(|()| match fs::metadata(&state.path) {
            Ok(m) if m.is_file() && !skip(&state.path) => tree::copy_entry(&state.path, &own),
            _ => Ok(()),
        }),
    }
    .map_err(io(&state.path, "cannot copy the host's state"))
}

/// Records the tree's manifest at the start and copies its gated entries
/// to `base/`, what an unapproved change is reset to.
fn record_start(state: &CheckedState, slot: &Path) -> Result<(), StateError> {
    let (tree, _) = tree_of(slot, state);
    let manifest = tree::manifest(&tree).map_err(io(&tree, "cannot read"))?;
    let globs = globs(state);
    let kept = |rel: &String| {
        manifest[rel] != "dir"
            && (key_gated(state) || gated_entry(&globs, rel, Some(&tree::join(&tree, rel))))
    };
    for rel in manifest.keys().filter(|rel| kept(rel)) {
        tree::copy_entry(&tree::join(&tree, rel), &tree::join(&slot.join("base"), rel))
            .map_err(io(&state.path, "cannot keep the approved copy"))?;
    }
    write_json(&slot.join("start.json"), &manifest)
}

/// Makes `new`'s tree from the previous run's slot `prev`: its tree as the
/// run left it, with each gated change (its own, or held from before) kept
/// when approved, else reset to the approved copy and held in `pending/`.
fn carry(prev: &Path, approved: &[Approval], state: &CheckedState, new: &Path) -> Result<(), StateError> {
    let (prev_tree, _) = tree_of(prev, state);
    let (tree, _) = tree_of(new, state);
    tree::copy_tree(&prev_tree, &tree, &|_| false).map_err(io(&state.path, "cannot carry the state"))?;
    let mut pending: BTreeMap<String, String> = BTreeMap::new();
    for (rel, digest, source) in gated_candidates(prev, state)? {
        let approve = approved.iter().any(|a| a.path == absolute(state, &rel) && a.digest == digest);
        // The tree is the sandbox's: never through a symlink it left.
        // A JSON file's other keys stay as the tree has them (a later run
        // may have moved them on); only its gated keys are taken or reset.
        let result = tree::beneath(&tree, &rel).and_then(|target| {
            if approve {
                return match merge_keys(state, &rel, &source, &target)? {
                    true => Ok(()),
                    false => place(&source, &digest, &target),
                };
            }
            pending.insert(rel.clone(), digest.clone());
            place(&source, &digest, &tree::beneath(&new.join("pending"), &rel)?)?;
            let base = tree::join(&prev.join("base"), &rel);
            match merge_keys(state, &rel, &base, &target)? {
                true => Ok(()),
                false => reset(&base, &target),
            }
        });
        result.map_err(io(&state.path, "cannot hold a gated change back"))?;
    }
    write_json(&new.join("pending.json"), &pending)
}

/// Puts the content `digest` names, from `source`, at `target`.
fn place(source: &Path, digest: &str, target: &Path) -> std::io::Result<()> {
    if digest == ABSENT {
        return tree::remove(target);
    }
    tree::copy_entry(source, target)
}

/// Resets `target` to the approved copy `base` (or removes it: there was none).
fn reset(base: &Path, target: &Path) -> std::io::Result<()> {
    if fs::symlink_metadata(base).is_ok() {
        return tree::copy_entry(base, target);
    }
    tree::remove(target)
}

/// The gated changes of slot `prev`: what its run changed, over what it
/// held from before; each with its digest and where its content is.
fn gated_candidates(prev: &Path, state: &CheckedState) -> Result<Vec<(String, String, PathBuf)>, StateError> {
    let (prev_tree, _) = tree_of(prev, state);
    let held: BTreeMap<String, String> = read_json(&prev.join("pending.json"))?;
    let mut out: BTreeMap<String, (String, PathBuf)> = held
        .into_iter()
        .map(|(rel, d)| (rel.clone(), (d, tree::join(&prev.join("pending"), &rel))))
        .collect();
    for (rel, _, now) in own_changes(prev, state)? {
        let candidate = tree::join(&prev_tree, &rel);
        if gated_change(state, &prev.join("base"), &rel, &candidate) {
            out.insert(rel.clone(), (now, candidate));
        }
    }
    Ok(out.into_iter().map(|(rel, (d, src))| (rel, d, src)).collect())
}

/// What the run of slot `slot` changed: each entry (not a bare directory)
/// whose digest differs from the start, with the digest then and now.
fn own_changes(slot: &Path, state: &CheckedState) -> Result<Vec<(String, String, String)>, StateError> {
    let (tree, _) = tree_of(slot, state);
    let start: Manifest = read_json(&slot.join("start.json"))?;
    let now = tree::manifest(&tree).map_err(io(&tree, "cannot read"))?;
    let mut rels: Vec<&String> = start.keys().chain(now.keys()).collect();
    rels.sort();
    rels.dedup();
    let digest = |m: &Manifest, rel: &str| m.get(rel).cloned().unwrap_or_else(|| ABSENT.to_owned());
    Ok(rels
        .into_iter()
        .map(|rel| (rel.clone(), digest(&start, rel), digest(&now, rel)))
        // A directory made or removed is its entries' changes; one that
        // replaced a file or symlink (or was replaced by one) is a change.
        .filter(|(_, then, now)| {
            then != now && ![then.as_str(), now.as_str()].iter().all(|d| [ABSENT, "dir"].contains(d))
        })
        .collect())
}

/// Makes each parent's overlay upper and work (the upper taking the host
/// directory's mode and owner, as overlay shows it as that directory) and
/// puts each single file's state in its parent's upper, or a whiteout
/// over the host's file where the state has none.
fn seed_parents(dir: &Path, plan: &Plan) -> Result<(), StateError> {
    let parents = parents(plan);
    for (n, parent) in parents.iter().enumerate() {
        let base = dir.join(format!("parents/{n}"));
        for sub in ["upper", "work"] {
            store::create_dir_all_private(&base.join(sub))
                .map_err(|source| StateError::Record { path: base.clone(), source })?;
        }
        let meta = fs::metadata(parent).map_err(io(parent, "cannot inspect"))?;
        let upper = base.join("upper");
        fs::set_permissions(&upper, fs::Permissions::from_mode(meta.mode() & 0o7777))
            .map_err(io(parent, "cannot set the mode of its layer"))?;
        if rustix::process::geteuid().is_root() {
            chown(&upper, Some(meta.uid()), Some(meta.gid()))
                .map_err(io(parent, "cannot chown its layer"))?;
        }
    }
    for (slot, state) in plan.paths.iter().enumerate().filter(|(_, s)| s.kind == StateKind::File) {
        let (_, own) = tree_of(&dir.join(slot.to_string()), state);
        let Some(seeded) = seeded_path(dir, &parents, state) else { continue };
        if fs::symlink_metadata(&own).is_ok() {
            tree::copy_entry(&own, &seeded).map_err(io(&state.path, "cannot seed the state file"))?;
        } else if fs::symlink_metadata(&state.path).is_ok() {
            // No state (yet, or deleted): the host's file must not show
            // through the parent's lower layer (it may be a secret store).
            tree::whiteout(&seeded).map_err(io(&state.path, "cannot hide the host's copy (Linux 5.8 or newer makes an overlay whiteout without privilege)"))?;
        }
    }
    Ok(())
}

/// Where single file `state` lives in its parent's upper.
fn seeded_path(dir: &Path, parents: &[PathBuf], state: &CheckedState) -> Option<PathBuf> {
    let parent = state.path.parent()?;
    let n = parents.iter().position(|p| p == parent)?;
    Some(dir.join(format!("parents/{n}/upper")).join(state.path.file_name()?))
}

/// After the run: takes each single file's state out of its parent's upper
/// into its tree (a whiteout there is a deletion), then removes the
/// parents' layers, whose other contents the run was never to keep.
pub(crate) fn collect(store: &Store, run: &RunId) -> Result<(), StateError> {
    let dir = dir_of(store, run);
    let plan: Plan = read_json(&dir.join("plan.json"))?;
    let parents = parents(&plan);
    for (slot, state) in plan.paths.iter().enumerate().filter(|(_, s)| s.kind == StateKind::File) {
        let (_, own) = tree_of(&dir.join(slot.to_string()), state);
        let Some(seeded) = seeded_path(&dir, &parents, state) else { continue };
        let result = if tree::is_whiteout(&seeded) {
            tree::remove(&own)
        } else if fs::symlink_metadata(&seeded).is_ok_and(|m| m.is_file()) {
            tree::copy_entry(&seeded, &own)
        } else {
            Ok(())
        };
        result.map_err(io(&state.path, "cannot keep the state file"))?;
    }
    // The work directory's own `work/` is mode 000 in a user namespace.
    let _ = fs::read_dir(dir.join("parents")).map(|entries| {
        for entry in entries.flatten() {
            let _ = fs::set_permissions(entry.path().join("work/work"), fs::Permissions::from_mode(0o700));
        }
    });
    let _ = fs::remove_dir_all(dir.join("parents"));
    Ok(())
}

/// The state changes of `job`: what its run changed and what it holds
/// back from earlier runs, one per path.
pub fn changes(store: &Store, job: &JobId) -> Result<Vec<StateChange>, StateError> {
    let (dir, plan) = previous_run(store, job)?.ok_or_else(|| StateError::NoState { job: job.clone() })?;
    let approved: Vec<Approval> = read_json(&dir.join("approved.json"))?;
    let is_approved =
        |path: &str, digest: &str| approved.iter().any(|a| a.path == path && a.digest == digest);
    let mut out = Vec::new();
    for (slot, state) in plan.paths.iter().enumerate() {
        let slot_dir = dir.join(slot.to_string());
        let (tree, _) = tree_of(&slot_dir, state);
        let start: Manifest = read_json(&slot_dir.join("start.json"))?;
        let mut held: BTreeMap<String, String> = read_json(&slot_dir.join("pending.json"))?;
        for (rel, then, now) in own_changes(&slot_dir, state)? {
            let gated = gated_change(state, &slot_dir.join("base"), &rel, &tree::join(&tree, &rel));
            // A gated change supersedes what was held at its path; an
            // ungated one (a JSON file's counters) leaves that held.
            if gated {
                held.remove(&rel);
            } else if held.contains_key(&rel) {
                continue;
            }
            let path = absolute(state, &rel);
            let approved = gated && is_approved(&path, &now);
            out.push(StateChange {
                change: kind(&then, &now),
                gated,
                approved,
                held: false,
                digest: now,
                path,
            });
        }
        for (rel, digest) in held {
            let path = absolute(state, &rel);
            let then = start.get(&rel).map_or(ABSENT, String::as_str);
            let approved = is_approved(&path, &digest);
            out.push(StateChange {
                change: kind(then, &digest),
                gated: true,
                approved,
                held: true,
                digest,
                path,
            });
        }
    }
    Ok(out)
}

fn kind(then: &str, now: &str) -> StateChangeKind {
    match (then == ABSENT, now == ABSENT) {
        (true, _) => StateChangeKind::Added,
        (_, true) => StateChangeKind::Deleted,
        _ => StateChangeKind::Modified,
    }
}

/// Approves the gated changes of `job` at `paths` (absolute), so the next
/// run carried from `job` gets them. Each must be one of its gated changes.
pub fn approve(store: &Store, job: &JobId, paths: &[PathBuf]) -> Result<Vec<StateChange>, StateError> {
    let listed = changes(store, job)?;
    let (dir, _) = previous_run(store, job)?.ok_or_else(|| StateError::NoState { job: job.clone() })?;
    let file = dir.join("approved.json");
    let mut approved: Vec<Approval> = read_json(&file)?;
    let mut done = Vec::new();
    for path in paths {
        let path = path.to_string_lossy();
        let change = listed
            .iter()
            .find(|c| c.gated && c.path == path)
            .ok_or_else(|| StateError::NotGated { path: path.to_string(), job: job.clone() })?;
        let approval = Approval { path: change.path.clone(), digest: change.digest.clone() };
        if !approved.contains(&approval) {
            approved.push(approval);
        }
        done.push(StateChange { approved: true, ..change.clone() });
    }
    write_json(&file, &approved)?;
    Ok(done)
}

/// Promotes `job`'s state into pvisor's per-user store (never the host's
/// real files): later runs outside a session start from it. Unapproved
/// gated changes are left out, as for a session's next run. Returns the
/// state paths promoted.
pub fn promote(store: &Store, job: &JobId) -> Result<Vec<PathBuf>, StateError> {
    let (dir, plan) = previous_run(store, job)?.ok_or_else(|| StateError::NoState { job: job.clone() })?;
    let approved: Vec<Approval> = read_json(&dir.join("approved.json"))?;
    let mut done = Vec::new();
    for (slot, state) in plan.paths.iter().enumerate() {
        let target = promoted_dir(store, &state.path);
        let staging = target.with_extension("new");
        let _ = fs::remove_dir_all(&staging);
        carry(&dir.join(slot.to_string()), &approved, state, &staging)?;
        let old = target.with_extension("old");
        let _ = fs::remove_dir_all(&old);
        if target.exists() {
            fs::rename(&target, &old).map_err(io(&target, "cannot replace the promoted state"))?;
        }
        fs::rename(&staging, &target).map_err(io(&target, "cannot promote the state"))?;
        let _ = fs::remove_dir_all(&old);
        done.push(state.path.clone());
    }
    Ok(done)
}

#[cfg(test)]
mod tests;
