//! `run --timings`: where a run's time went, phase by phase.
//!
//! Boundary: reads what is already recorded (the Run's Trace events, whose
//! times are taken as each fact is written, and the executor's own setup
//! steps in its `attempt.<executor>` facts) plus the moment this process
//! started and now. It adds nothing to the run's path: a run without
//! `--timings` does exactly the same work.

use std::sync::OnceLock;
use std::time::SystemTime;

use pvisor::actions::{Events, Trace};
use pvisor::{RunOutcome, Runtime};
use pvisor_core::event::Event;
use serde::Serialize;

use crate::json::JsonType;

static PROCESS_STARTED: OnceLock<SystemTime> = OnceLock::new();

/// Notes when this process started; called first thing in `main`.
pub fn mark_process_start() {
    let _ = PROCESS_STARTED.set(SystemTime::now());
}

/// The phases, each from one recorded milestone to the next: (name, the
/// event that ends it, what it covers).
const PHASES: &[(&str, &str, &str)] = &[
    ("startup", "job.created", "flags, config, state directory, the Job's records"),
    ("admission", "attempt.created", "policy, network, rewrites, placement"),
    ("sandbox setup", "attempt.started", "namespaces, overlay, seccomp, cgroups"),
    ("command", "attempt.exited", "the command itself, to its exit"),
    ("seal", "stage.sealed", "the upper layer read, the stage sealed"),
    ("bundle", "bundle.saved", "the Run Bundle written"),
];

/// The `timings` report: `run --json --timings` prints it as one line.
#[derive(Debug, Serialize)]
pub struct Timings {
    pub total_ms: f64,
    pub phases: Vec<Phase>,
}

#[derive(Debug, Serialize)]
pub struct Phase {
    pub phase: String,
    pub ms: f64,
    pub covers: String,
    /// The executor's setup steps, within `sandbox setup`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<Step>,
}

#[derive(Debug, Serialize)]
pub struct Step {
    pub step: String,
    pub ms: f64,
}

fn ms_between(from: SystemTime, to: SystemTime) -> f64 {
    to.duration_since(from).map(|d| d.as_secs_f64() * 1e3).unwrap_or(0.0)
}

/// The report of `outcome`'s Run, from its events, ending `now`.
pub fn of_events(events: &[Event], started: SystemTime, now: SystemTime) -> Timings {
    let time_of =
        |kind: &str| events.iter().rev().find(|e| e.kind.as_str() == kind).map(|e| e.time.system_time());
    let mut phases = Vec::new();
    let mut from = started;
    for (name, ends_at, covers) in PHASES {
        let Some(to) = time_of(ends_at) else { continue };
        // Milestones are stamped by more than one process (and a retried
        // step stamps again), so one may sort before the last; it then
        // ends a phase of zero rather than rewinding the clock, and the
        // phases still add up to the whole.
        let to = to.max(from);
        let ms = ms_between(from, to);
        let steps = if *ends_at == "attempt.started" { setup_steps(events, ms) } else { Vec::new() };
        phases.push(Phase { phase: (*name).into(), ms, covers: (*covers).into(), steps });
        from = to;
    }
    if let Some(last) = events.last().map(|e| e.time.system_time().max(from)) {
        let covers = "the receipt and the Job's final records";
        phases.push(Phase {
            phase: "finalize".into(),
            ms: ms_between(from, last),
            covers: covers.into(),
            steps: Vec::new(),
        });
        from = last;
    }
    let covers = "the summary, and the process's exit";
    phases.push(Phase {
        phase: "report".into(),
        ms: ms_between(from, now),
        covers: covers.into(),
        steps: Vec::new(),
    });
    Timings { total_ms: ms_between(started, now.max(from)), phases }
}

/// The executor's own setup steps (`setup_us` in its facts), if it
/// reported them. Nested steps happen within the step before them: `init.*`
/// within `sandbox_ready`, the supervisor's wait for init, and `guest.*`
/// within the vm executor's `guest_setup`; `other` is the rest of the phase (the
/// Attempt, Run and Job recorded as running, the sandbox's thread).
fn setup_steps(events: &[Event], phase_ms: f64) -> Vec<Step> {
    let facts = events.iter().rev().find_map(|e| e.data.get("setup_us").and_then(|s| s.as_array()).cloned());
    let mut steps: Vec<Step> = facts
        .unwrap_or_default()
        .iter()
        .filter_map(|pair| {
            let step = pair.get(0)?.as_str()?.to_owned();
            Some(Step { step, ms: pair.get(1)?.as_u64()? as f64 / 1e3 })
        })
        .collect();
    if !steps.is_empty() {
        // A nested step (`init.*`, `guest.*`) is part of the step before it.
        let top_level: f64 = steps.iter().filter(|s| !s.step.contains('.')).map(|s| s.ms).sum();
        steps.push(Step { step: "other".into(), ms: (phase_ms - top_level).max(0.0) });
    }
    steps
}

/// Prints `outcome`'s timings: a table on stderr, or a `timings` line under
/// `--json`. Timings that cannot be read are a warning, not a failure.
pub fn report(runtime: &Runtime, outcome: &RunOutcome) {
    let now = SystemTime::now();
    let started = *PROCESS_STARTED.get().unwrap_or(&now);
    let events = match runtime.execute(Events { job: outcome.job.clone() }) {
        Ok(Trace { events, .. }) => events.into_iter().filter(|e| e.run == outcome.run).collect::<Vec<_>>(),
        Err(e) => return crate::output::warning(&format!("--timings: cannot read the Trace: {e}")),
    };
    let timings = of_events(&events, started, now);
    crate::output::say(JsonType::Timings, &timings, || table(&timings));
}

fn table(timings: &Timings) -> String {
    let mut lines = vec![format!("pvisor: timings, {:.1} ms in all:", timings.total_ms)];
    for phase in &timings.phases {
        lines.push(format!("  {:>8.1} ms  {:<14} {}", phase.ms, phase.phase, phase.covers));
        for step in &phase.steps {
            lines.push(format!("  {:>8} {:>8.1} ms  {}", "", step.ms, step.step));
        }
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn event(kind: &str, at_ms: u64, data: serde_json::Value) -> Event {
        let time = SystemTime::UNIX_EPOCH + Duration::from_millis(at_ms);
        serde_json::from_value(serde_json::json!({
            "format": 1, "id": "run-1:1", "run": "run-01JD4000000000000000000000", "seq": 1,
            "time": pvisor_core::time::Timestamp::from(time), "type": kind, "data": data,
        }))
        .unwrap()
    }

    #[test]
    fn each_phase_runs_from_one_milestone_to_the_next_and_setup_shows_its_steps() {
        let events = [
            event("job.created", 1_010, serde_json::Value::Null),
            event("attempt.created", 1_012, serde_json::Value::Null),
            event("attempt.started", 1_020, serde_json::Value::Null),
            event(
                "attempt.ns",
                1_020,
                serde_json::json!({ "setup_us": [["spawn_helper", 1500], ["init.mounts", 4000]] }),
            ),
            event("attempt.exited", 1_050, serde_json::Value::Null),
            event("stage.sealed", 1_051, serde_json::Value::Null),
            event("bundle.saved", 1_053, serde_json::Value::Null),
            event("run.completed", 1_056, serde_json::Value::Null),
        ];
        let at = |ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
        let timings = of_events(&events, at(1_000), at(1_060));
        let shown: Vec<(&str, f64)> =
            timings.phases.iter().map(|p| (p.phase.as_str(), p.ms.round())).collect();
        assert_eq!(
            shown,
            [
                ("startup", 10.0),
                ("admission", 2.0),
                ("sandbox setup", 8.0),
                ("command", 30.0),
                ("seal", 1.0),
                ("bundle", 2.0),
                ("finalize", 3.0),
                ("report", 4.0)
            ]
        );
        assert_eq!(timings.total_ms.round(), 60.0);
        let steps: Vec<(&str, f64)> =
            timings.phases[2].steps.iter().map(|s| (s.step.as_str(), s.ms)).collect();
        assert_eq!(steps, [("spawn_helper", 1.5), ("init.mounts", 4.0), ("other", 6.5)]);
        assert!(table(&timings).contains("init.mounts"));
    }

    #[test]
    fn a_milestone_stamped_before_the_last_ends_a_phase_of_zero_and_the_sum_holds() {
        let events = [
            event("job.created", 1_010, serde_json::Value::Null),
            event("attempt.created", 1_012, serde_json::Value::Null),
            event("attempt.started", 1_020, serde_json::Value::Null),
            event("attempt.exited", 1_050, serde_json::Value::Null),
            // Another process stamped the seal a little before the exit.
            event("stage.sealed", 1_049, serde_json::Value::Null),
            event("bundle.saved", 1_053, serde_json::Value::Null),
            event("run.completed", 1_056, serde_json::Value::Null),
        ];
        let at = |ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
        let timings = of_events(&events, at(1_000), at(1_060));
        let seal = timings.phases.iter().find(|p| p.phase == "seal").unwrap();
        assert_eq!(seal.ms, 0.0);
        let sum: f64 = timings.phases.iter().map(|p| p.ms).sum();
        assert!((sum - timings.total_ms).abs() < 1e-6, "{sum} vs {}", timings.total_ms);
    }
}
