//! Which run of a session made each change its head has staged.
//!
//! A run's stage starts as a copy of the previous run's, so every run's
//! change list repeats what came before. A change is attributed to the run
//! that last made the path what it is now: walking back from the head, the
//! earliest run of the unbroken stretch whose change at that path is the
//! same (kind, entry type, mode and content digest).

use std::collections::BTreeMap;

use pvisor_core::ids::JobId;
use pvisor_core::records::ChangeEntry;
use pvisor_core::store::RelPath;

/// A change of the session's head and the run that made it.
#[derive(Clone, Debug, PartialEq)]
pub struct Attributed<'a> {
    pub change: &'a ChangeEntry,
    pub job: &'a JobId,
}

/// Attributes each change of the last run in `runs` (oldest first, each
/// with its full change list) to the run that made it.
pub fn attribute<'a>(runs: &'a [(JobId, Vec<ChangeEntry>)]) -> Vec<Attributed<'a>> {
    let Some(((head_job, head), earlier)) = runs.split_last() else { return Vec::new() };
    let indexed: Vec<BTreeMap<&RelPath, &ChangeEntry>> =
        earlier.iter().map(|(_, changes)| changes.iter().map(|c| (&c.path, c)).collect()).collect();
    head.iter()
        .map(|change| {
            let mut job = head_job;
            for (at, (earlier_job, _)) in earlier.iter().enumerate().rev() {
                match indexed[at].get(&change.path) {
                    Some(before) if same(before, change) => job = earlier_job,
                    _ => break,
                }
            }
            Attributed { change, job }
        })
        .collect()
}

fn same(a: &ChangeEntry, b: &ChangeEntry) -> bool {
    a.kind == b.kind && a.entry == b.entry && a.mode == b.mode && a.blake3 == b.blake3
}

#[cfg(test)]
mod tests {
    use super::*;
    use pvisor_core::records::{ChangeKind, EntryType};

    fn change(path: &str, kind: ChangeKind, digest: &str) -> ChangeEntry {
        ChangeEntry {
            path: RelPath::new(std::path::Path::new(path)),
            kind,
            entry: EntryType::File,
            size: 1,
            mode: 0o644,
            blake3: Some(digest.into()),
            hardlink_of: None,
        }
    }

    #[test]
    fn each_change_goes_to_the_run_that_last_made_it() {
        let (a, b, c) = (JobId::generate(), JobId::generate(), JobId::generate());
        let runs = vec![
            (
                a.clone(),
                vec![change("kept", ChangeKind::Added, "1"), change("edited", ChangeKind::Added, "1")],
            ),
            (
                b.clone(),
                vec![
                    change("kept", ChangeKind::Added, "1"),
                    change("edited", ChangeKind::Added, "2"),
                    change("new", ChangeKind::Added, "1"),
                ],
            ),
            (
                c.clone(),
                vec![
                    change("kept", ChangeKind::Added, "1"),
                    change("edited", ChangeKind::Added, "2"),
                    change("new", ChangeKind::Added, "1"),
                    change("last", ChangeKind::Added, "9"),
                ],
            ),
        ];
        let got: Vec<(String, JobId)> =
            attribute(&runs).into_iter().map(|a| (a.change.path.display_escaped(), a.job.clone())).collect();
        assert_eq!(
            got,
            vec![("kept".into(), a), ("edited".into(), b.clone()), ("new".into(), b), ("last".into(), c)]
        );
    }
}
