//! What landing a commit made in the sandbox needs, judged by what it
//! changes in the work tree: apply holds a commit back by it, review says
//! why. Boundary: judging only; `pvisor_stage::commits` checks and lands.

use std::path::Path;

use pvisor_core::records::{ChangeEntry, EntryType};
use pvisor_stage::beneath::Root;
use pvisor_stage::commits::Checked;
use pvisor_stage::sensitive::Sensitive;

/// What landing a commit needs, judged by what it changes in the work tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum CommitVerdict {
    Free,
    /// Consent: a path it changes would need it as a staged file.
    Sensitive(String),
    /// Never landed: a path it changes is pvisor's own (never applied).
    Forbidden(String),
}

/// Judges `checked` by the paths its commits change in the work tree, as
/// staged files are judged, the rules bound with those paths (so a
/// directory's structure, a virtualenv or a bare repository, counts for
/// them too). A commit is checked out sooner or later (`git reset --hard`,
/// `git stash`, a fresh clone), so what it carries runs as surely as a
/// file applied. A submodule moved to another commit needs consent too:
/// `git submodule update` checks out what nobody reviewed.
pub(super) fn judge_commit(
    checked: &Checked,
    sensitive: &Sensitive,
    (workspace, staged): (&Path, &[ChangeEntry]),
    (ws, upper): (&Root, &Root),
) -> CommitVerdict {
    let mut changes = staged.to_vec();
    changes.extend(checked.tree_changes.iter().cloned());
    let bound = sensitive.bind(workspace, Some(ws), Some(upper), &changes);
    let says = |change: &ChangeEntry, why: &str| {
        format!("the commit made in the sandbox changes {}: {why}", change.path.display_escaped())
    };
    if let Some((change, why)) =
        checked.tree_changes.iter().find_map(|c| bound.forbidden(c).map(|why| (c, why)))
    {
        return CommitVerdict::Forbidden(says(change, &why));
    }
    for change in &checked.tree_changes {
        if change.entry == EntryType::Special {
            return CommitVerdict::Sensitive(says(
                change,
                "a submodule moved to another commit, which `git submodule update` checks out",
            ));
        }
        if let Some(why) = bound.reason_for(change) {
            return CommitVerdict::Sensitive(says(change, &why));
        }
    }
    CommitVerdict::Free
}
