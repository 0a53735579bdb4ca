//! Writing a run of independent files on several threads.
//!
//! Most of a large apply is files nothing else in the plan depends on: not
//! directories (their children come after them), not hard links, not the
//! first names of links. A run of them is written by a few threads at once,
//! each through roots of its own (a `Root` is confined the same way on any
//! thread, and keeps a per-thread cache). The caller still sees every result
//! in the plan's order, so `applied`, `failed`, progress and the ledger read
//! as a one-thread apply would write them. Only the order the files land in
//! changes, and nothing depends on it: an interrupted apply is settled path
//! by path (`apply::settle_interrupted`), and the outcomes are recorded only
//! after the `syncfs` that follows every write.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;

use pvisor_core::records::ChangeEntry;

use crate::apply::FileCopy;
use crate::beneath::Root;
use crate::prefetch::Cursor;
use crate::StageError;

/// The fewest files worth starting threads for.
pub(crate) const FEWEST: usize = 64;

/// The most threads that write at once. Each spends its time in the
/// filesystem's create, copy and link, so more than the CPUs gain nothing.
const WRITERS: usize = 4;

/// How many files a writer takes at a time, and hands back together: one
/// wake-up of the caller per file cost more than the second thread gained.
const BATCH: usize = 32;

/// What writing one file gave: its warnings, or why it was not written.
pub(crate) type Written = Result<Vec<String>, StageError>;

/// Writes `files` (each `(index in the plan, change)`) and calls
/// `each(position in files, result)` for every one, in order, on this
/// thread. Where no writer thread can be started, this thread writes them.
pub(crate) fn write_all(
    ws: &Root,
    upper: &Root,
    files: &[(usize, &ChangeEntry)],
    copy: &FileCopy,
    cursor: &Cursor,
    mut each: impl FnMut(usize, Written),
) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(WRITERS);
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        let (sender, results) = mpsc::channel();
        let mut started = 0;
        for _ in 0..threads {
            let (Ok(ws_fd), Ok(upper_fd)) = (ws.dup_fd(), upper.dup_fd()) else { break };
            let (sender, next) = (sender.clone(), &next);
            let writer = move || {
                let (ws, upper) = (Root::from_fd(ws_fd), Root::from_fd(upper_fd));
                write_share(&ws, &upper, files, copy, cursor, next, |first, written| {
                    sender.send((first, written)).is_ok()
                });
            };
            let spawned = std::thread::Builder::new().name("pvisor-apply".into()).spawn_scoped(scope, writer);
            started += usize::from(spawned.is_ok());
        }
        drop(sender);
        if started == 0 {
            write_share(ws, upper, files, copy, cursor, &next, |first, written| {
                for (position, written) in (first..).zip(written) {
                    each(position, written);
                }
                true
            });
            return;
        }
        let lost = |position: usize| {
            let stopped = std::io::Error::other("the thread writing it stopped");
            Err(StageError::io("write", files[position].1.path.as_path(), stopped))
        };
        in_order(results, files.len(), lost, each);
    });
}

/// Takes batches of files from `next` until none is left (or `deliver`
/// says stop), writes them and delivers their results with the position of
/// the first.
fn write_share(
    ws: &Root,
    upper: &Root,
    files: &[(usize, &ChangeEntry)],
    copy: &FileCopy,
    cursor: &Cursor,
    next: &AtomicUsize,
    mut deliver: impl FnMut(usize, Vec<Written>) -> bool,
) {
    loop {
        let first = next.fetch_add(BATCH, Ordering::Relaxed);
        let Some(batch) = files.get(first..files.len().min(first + BATCH)) else { return };
        if batch.is_empty() {
            return;
        }
        let written = batch
            .iter()
            .map(|&(index, change)| {
                cursor.reached(index);
                let mut warnings = Vec::new();
                copy.write(ws, upper, change, &mut warnings).map(|()| warnings)
            })
            .collect();
        if !deliver(first, written) {
            return;
        }
    }
}

/// Hands `count` results to `each` in position order as their batches
/// arrive. A position no writer delivered (a writer panicked; the scope
/// re-raises it after this) is reported as `lost(position)`.
fn in_order(
    batches: mpsc::Receiver<(usize, Vec<Written>)>,
    count: usize,
    lost: impl Fn(usize) -> Written,
    mut each: impl FnMut(usize, Written),
) {
    let mut waiting = BTreeMap::new();
    let mut due = 0;
    for (first, written) in batches {
        waiting.extend((first..).zip(written));
        while let Some(written) = waiting.remove(&due) {
            each(due, written);
            due += 1;
        }
    }
    for position in due..count {
        each(position, waiting.remove(&position).unwrap_or_else(|| lost(position)));
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::{in_order, FEWEST};
    use crate::apply::{execute, Planned, Verdict};
    use crate::beneath::Root;
    use crate::ledger::Ledger;

    /// A plan of 300 new files goes through the writers: every file lands
    /// with its staged contents, the two that cannot (gone from the stage,
    /// changed since sealing) fail alone, and progress and `applied` list
    /// the rest in the plan's order.
    #[test]
    fn files_written_at_once_are_reported_in_plan_order_with_their_failures() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (upper_dir, ws_dir) = (dir.path().join("upper"), dir.path().join("ws"));
        fs::create_dir(&upper_dir).expect("upper");
        fs::create_dir(&ws_dir).expect("ws");
        for i in 0..300 {
            fs::write(upper_dir.join(format!("f{i:03}")), format!("data-{i}\n")).expect("staged file");
        }
        let changes = crate::scan(&upper_dir, &ws_dir).expect("scan");
        assert!(changes.len() >= 4 * FEWEST, "enough files for the writers");
        fs::remove_file(upper_dir.join("f100")).expect("remove");
        fs::write(upper_dir.join("f200"), "changed after sealing\n").expect("change");
        let plan: Vec<Planned> = changes
            .iter()
            .map(|c| Planned { change: c.clone(), verdict: Verdict::Apply { forced: false }, implied: false })
            .collect();
        let (ws, upper) =
            (Root::open(&ws_dir).expect("ws root"), Root::open(&upper_dir).expect("upper root"));
        let ledger = Ledger::new(dir.path(), &pvisor_core::ids::RunId::generate());
        let mut progress = Vec::new();
        let done = execute(&ws, &upper, &ledger, &plan, 0, |c| progress.push(c.path.display_escaped()))
            .expect("execute");

        let failed: Vec<String> = done.failed.iter().map(|(c, _)| c.path.display_escaped()).collect();
        assert_eq!(failed, ["f100", "f200"]);
        let expected: Vec<String> =
            plan.iter().map(|p| p.change.path.display_escaped()).filter(|p| !failed.contains(p)).collect();
        assert_eq!(progress, expected);
        let applied: Vec<String> = done.applied.iter().map(|(c, _)| c.path.display_escaped()).collect();
        assert_eq!(applied, expected);
        for name in &expected {
            let i: usize = name[1..].parse().expect("index");
            assert_eq!(fs::read_to_string(ws_dir.join(name)).expect("applied"), format!("data-{i}\n"));
        }
        assert!(!ws_dir.join("f100").exists() && !ws_dir.join("f200").exists());
    }

    /// Batches that arrive out of order are handed on in order, and a
    /// missing one is reported as not written, in its place.
    #[test]
    fn results_come_out_in_plan_order_and_a_lost_one_is_a_failure() {
        let (sender, results) = std::sync::mpsc::channel();
        for (first, count) in [(2, 2), (0, 1), (1, 1), (6, 1)] {
            sender.send((first, (0..count).map(|_| Ok(Vec::new())).collect())).expect("send");
        }
        drop(sender);
        let mut seen = Vec::new();
        let lost = |_| Err(crate::StageError::io("write", "lost", std::io::Error::other("stopped")));
        in_order(results, 7, lost, |position, written| seen.push((position, written.is_ok())));
        assert_eq!(seen, [(0, true), (1, true), (2, true), (3, true), (4, false), (5, false), (6, true)]);
    }
}
