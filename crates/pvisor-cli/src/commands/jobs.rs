//! `pvisor jobs [--json] [--tree] [--label KEY=VALUE]`.

use std::io::Write;

use pvisor::{JobListing, JobStatus, Runtime};

use crate::cli::JobsArgs;
use crate::json::{json_line, JsonType};
use crate::output::{ending, shell_words};

pub fn cmd_jobs(runtime: &Runtime, args: JobsArgs) -> anyhow::Result<i32> {
    let store = runtime.store();
    let mut out = crate::output::stdout();
    let mut broken = 0;
    if !args.json {
        writeln!(out, "{:<30}  {:<20}  {:>7}  {:<27}  COMMAND", "JOB", "STATE", "CHANGES", "CREATED")?;
    }
    for id in store.list_jobs()? {
        if let Err(e) = super::recover(runtime, &id) {
            eprintln!("pvisor: warning: {id}: {e}");
        }
    }
    let mut listing = runtime.execute(pvisor::actions::ListJobs)?;
    if args.tree {
        listing = tree_order(listing);
    }
    let filtered = !args.label.is_empty();
    for (id, status) in listing {
        match status {
            // A damaged Job's labels are unknown: with a filter it is only
            // counted in the warning below.
            Ok(s) if !pvisor_core::labels::matches(&s.labels, &args.label) => continue,
            Err(_) if filtered => broken += 1,
            Ok(s) if args.json => json_line(&mut out, JsonType::Job, &s)?,
            Ok(s) => {
                let changes = s.changes.map_or("-".to_owned(), |n| n.to_string());
                let depth = if args.tree { depth_of(store, &s) } else { 0 };
                let name = format!("{}{}", "  ".repeat(depth), s.job);
                writeln!(
                    out,
                    "{:<30}  {:<20}  {:>7}  {:<27}  {}",
                    name,
                    ending(s.state.as_str(), s.exit_code, s.signal),
                    changes,
                    s.created_at.to_string(),
                    shell_words(&s.program, &s.args)
                )?;
            }
            Err(e) => {
                broken += 1;
                if args.json {
                    let error = e.to_string();
                    let line = serde_json::json!({"job": id, "message": error, "error": error});
                    json_line(&mut out, JsonType::Error, &line)?;
                } else {
                    writeln!(out, "{id:<30}  {:<20}  error: {e}", "damaged")?;
                }
            }
        }
    }
    // The list itself succeeded: one damaged Job must not make every later
    // `pvisor jobs` fail. It is named on stderr as well as in the list.
    if broken > 0 {
        let shown = if filtered { "not listed: their labels cannot be read" } else { "listed as `damaged`" };
        eprintln!(
            "pvisor: warning: {broken} job(s) have damaged records ({shown}); \
             `pvisor status JOB` names the file, `pvisor gc` removes half-created ones"
        );
    }
    Ok(0)
}

/// Orders Jobs so each fork follows its parent (depth-first, oldest first).
fn tree_order(listing: Vec<JobListing>) -> Vec<JobListing> {
    use std::collections::BTreeMap;
    let parent_of =
        |l: &JobListing| l.1.as_ref().ok().and_then(|s| s.lineage.as_ref()).map(|l| l.parent_job.clone());
    let ids: std::collections::BTreeSet<_> = listing.iter().map(|l| l.0.clone()).collect();
    let mut children: BTreeMap<pvisor_core::ids::JobId, Vec<JobListing>> = BTreeMap::new();
    let mut roots = Vec::new();
    for l in listing {
        match parent_of(&l) {
            Some(p) if ids.contains(&p) => children.entry(p).or_default().push(l),
            _ => roots.push(l),
        }
    }
    fn walk(
        node: JobListing,
        children: &mut BTreeMap<pvisor_core::ids::JobId, Vec<JobListing>>,
        out: &mut Vec<JobListing>,
    ) {
        let id = node.0.clone();
        out.push(node);
        for child in children.remove(&id).unwrap_or_default() {
            walk(child, children, out);
        }
    }
    let mut out = Vec::new();
    for root in roots {
        walk(root, &mut children, &mut out);
    }
    out
}

/// How many forks deep `status` is.
fn depth_of(store: &pvisor_core::store::Store, status: &JobStatus) -> usize {
    let mut depth = 0;
    let mut parent = status.lineage.as_ref().map(|l| l.parent_job.clone());
    while let Some(p) = parent.take() {
        depth += 1;
        if depth > 64 {
            break;
        }
        parent = store
            .read::<pvisor_core::records::JobRecord>(&store.job_file(&p))
            .ok()
            .and_then(|j| j.lineage.map(|l| l.parent_job));
    }
    depth
}
