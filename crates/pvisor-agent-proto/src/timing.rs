//! Setup steps timed on the monotonic clock, the same way on both sides of
//! the protocol: the guest's own setup steps travel in `Reply::Ready`, and
//! every executor reports its steps as `setup_us`, a list of `(step,
//! microseconds)` in its facts, which `run --timings` shows inside the
//! `sandbox setup` phase. A nested step (`init.mounts`, `guest.overlay`) is
//! part of the step before it, not after it.

use std::time::Instant;

/// Times consecutive setup steps on the monotonic clock (which a pid or
/// user namespace does not change): each mark is the time since the
/// previous one.
#[derive(Debug)]
pub struct PhaseClock {
    last: Instant,
    phases: Vec<(String, u64)>,
}

impl PhaseClock {
    pub fn start() -> Self {
        Self { last: Instant::now(), phases: Vec::new() }
    }

    /// Ends step `name` now.
    pub fn mark(&mut self, name: &str) {
        let now = Instant::now();
        let us = u64::try_from(now.duration_since(self.last).as_micros()).unwrap_or(u64::MAX);
        self.phases.push((name.to_owned(), us));
        self.last = now;
    }

    /// Adds `steps`, each named `prefix.NAME`, as part of the step just
    /// marked (they took place within it; the clock does not move).
    pub fn nested(&mut self, prefix: &str, steps: Vec<(String, u64)>) {
        self.phases.extend(steps.into_iter().map(|(name, us)| (format!("{prefix}.{name}"), us)));
    }

    /// The steps so far, in order.
    pub fn phases(self) -> Vec<(String, u64)> {
        self.phases
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_mark_is_the_time_since_the_last() {
        let mut clock = PhaseClock::start();
        std::thread::sleep(std::time::Duration::from_millis(20));
        clock.mark("slow");
        clock.mark("quick");
        let phases = clock.phases();
        let names: Vec<&str> = phases.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["slow", "quick"]);
        assert!(phases[0].1 >= 20_000 && phases[1].1 < phases[0].1, "{phases:?}");
    }

    #[test]
    fn nested_steps_are_named_for_their_side_and_take_no_time_of_their_own() {
        let mut clock = PhaseClock::start();
        clock.mark("guest_setup");
        clock.nested("guest", vec![("overlay".into(), 7)]);
        std::thread::sleep(std::time::Duration::from_millis(5));
        clock.mark("exec");
        let phases = clock.phases();
        assert_eq!(phases[1], ("guest.overlay".to_string(), 7));
        assert_eq!(phases[2].0, "exec");
        assert!(phases[2].1 >= 5_000, "{phases:?}");
    }
}
