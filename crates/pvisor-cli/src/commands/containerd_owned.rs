//! Jobs a containerd shim runs (a container's VM). containerd must see
//! every change to such a Job, so `pvisor kill`, `suspend` and `resume`
//! leave one that its shim holds (running under it, or paused) to
//! containerd's clients and say which command to use. A Job that has ended,
//! or whose shim is gone (`unknown`), is pvisor's alone again.

use pvisor::actions::Status;
use pvisor::Runtime;
use pvisor_core::ids::JobId;
use pvisor_core::labels::{containerd_container, ContainerdContainer};
use pvisor_core::state::JobState;

/// What a user asked pvisor to do to a Job.
#[derive(Clone, Copy, Debug)]
pub enum Change {
    Kill,
    Suspend,
    Resume,
}

/// Why pvisor left the change to containerd.
#[derive(Debug, thiserror::Error)]
#[error(
    "{job} is containerd container {container:?} (namespace {namespace:?}), which containerd-shim-pvisor-v1 \
     runs; pvisor does not {verb} it behind containerd's back, which would lose the container's task.\n\
     hint: {how}"
)]
pub struct LeftToContainerd {
    job: JobId,
    container: String,
    namespace: String,
    verb: &'static str,
    how: String,
}

/// Refuses `change` on `job` while a containerd shim runs it.
pub fn refuse_if_running(runtime: &Runtime, job: &JobId, change: Change) -> anyhow::Result<()> {
    let status = runtime.execute(Status { job: job.clone() })?;
    // A paused container's Job is suspended, with no process of its own:
    // its shim holds it, as far as pvisor can tell.
    let held = (status.state == JobState::Running && status.live) || status.state == JobState::Suspended;
    if !held {
        return Ok(());
    }
    let Some(owner) = containerd_container(&status.labels) else { return Ok(()) };
    Err(LeftToContainerd {
        job: job.clone(),
        container: owner.container.to_owned(),
        namespace: owner.namespace.to_owned(),
        verb: verb(change),
        how: how(&owner, change, job),
    }
    .into())
}

/// How to resume a suspended Job: through containerd if a shim runs it.
pub fn resume_hint(labels: &pvisor_core::labels::Labels, job: &JobId) -> String {
    match containerd_container(labels) {
        Some(owner) => how(&owner, Change::Resume, job),
        None => format!("`{} resume {job}` continues it", crate::output::me()),
    }
}

fn verb(change: Change) -> &'static str {
    match change {
        Change::Kill => "kill",
        Change::Suspend => "suspend",
        Change::Resume => "resume",
    }
}

fn how(owner: &ContainerdContainer<'_>, change: Change, job: &JobId) -> String {
    let (ns, id) = (owner.namespace, owner.container);
    let ctr = match change {
        Change::Kill => format!("`ctr -n {ns} task kill {id}`"),
        Change::Suspend => format!("`ctr -n {ns} task pause {id}`"),
        Change::Resume => format!("`ctr -n {ns} task resume {id}`"),
    };
    let kubernetes = match (owner.pod, change) {
        (Some((pod, namespace)), Change::Kill) => {
            format!(" (a Kubernetes pod: `kubectl delete pod {pod} -n {namespace}`)")
        }
        _ => String::new(),
    };
    let force = match change {
        Change::Kill => format!("; `{} kill --force {job}` ends it anyway", crate::output::me()),
        // A paused container whose shim is gone can only be closed.
        Change::Resume => format!(
            "; if containerd no longer knows the container, `{} kill --force {job}` closes the Job",
            crate::output::me()
        ),
        Change::Suspend => String::new(),
    };
    format!("{ctr}{kubernetes}{force}")
}
