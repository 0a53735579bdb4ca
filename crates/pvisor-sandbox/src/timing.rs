//! Setup steps timed on the monotonic clock, which every executor reports
//! the same way: `setup_us`, a list of `(step, microseconds)` in its facts,
//! which `run --timings` shows inside the `sandbox setup` phase.

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
}
