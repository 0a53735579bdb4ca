//! Where a container's VM stands ([`Phase`]) and the table of the moves
//! between its stages ([`Stage::can_move`]): every change of phase goes
//! through [`Phase::move_to`].

/// Where the container's VM stands. Every change goes through
/// [`State::move_to`], which asks [`Stage::can_move`]'s table.
#[derive(Debug)]
pub(super) enum Phase {
    /// A generation (Attempt) is coming up: the first boot, or a resume.
    /// As while pausing, a guest channel that ends now is a pause.
    Starting,
    /// A generation (Attempt) is live: its run can be cancelled, its guest reached.
    Live,
    /// Being suspended: a guest channel that ends now is a pause.
    Pausing,
    /// Suspended to `checkpoint`; the Job continues with a resume.
    Paused { checkpoint: String },
    /// The Job has ended (`summary`), or is ending (`None`).
    Ended { summary: Option<String> },
}

/// A [`Phase`] without its data: what the table of moves is written over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stage {
    Starting,
    Live,
    Pausing,
    Paused,
    /// `Ended { summary: None }`: a stop waits for the generation's end.
    Ending,
    /// `Ended { summary: Some(_) }`: final.
    Ended,
}

impl Phase {
    /// Moves to `to` if the table allows it from where the VM stands; a
    /// refused move leaves it where it stood.
    pub(super) fn move_to(&mut self, to: Phase) -> Result<(), IllegalMove> {
        let (from, next) = (self.stage(), to.stage());
        if !from.can_move(next) {
            return Err(IllegalMove { from, to: next });
        }
        *self = to;
        Ok(())
    }

    pub(super) fn stage(&self) -> Stage {
        match self {
            Phase::Starting => Stage::Starting,
            Phase::Live => Stage::Live,
            Phase::Pausing => Stage::Pausing,
            Phase::Paused { .. } => Stage::Paused,
            Phase::Ended { summary: None } => Stage::Ending,
            Phase::Ended { summary: Some(_) } => Stage::Ended,
        }
    }

    /// Starting, pausing or paused: the guest is (about to be) away, not gone.
    pub(super) fn is_paused(&self) -> bool {
        matches!(self, Phase::Starting | Phase::Pausing | Phase::Paused { .. })
    }
}

impl Stage {
    /// Whether the VM may move from `self` to `to`. Written per source stage
    /// with no catch-all arm (as the daemon's sandbox table), so a new stage
    /// forces a decision about every edge.
    pub(super) fn can_move(self, to: Stage) -> bool {
        use Stage::*;
        match self {
            // Up (boot or resume); the boot or the restore failed (Ended);
            // the restore failed and the checkpoint stands (Paused); a
            // delete while it comes up (Ending).
            Starting => matches!(to, Live | Ended | Paused | Ending),
            // A pause; a delete; the generation ended on its own.
            Live => matches!(to, Pausing | Ending | Ended),
            // Saved; the save failed with the VM alive (Live) or not
            // (Ended); a delete while it saves.
            Pausing => matches!(to, Paused | Live | Ended | Ending),
            // A resume; a delete; a delete that began before the pause
            // landed records the Job's end.
            Paused => matches!(to, Starting | Ending | Ended),
            // The generation's end is recorded. A resume or pause that
            // completes after the delete began still lands (Live, Paused),
            // as it always has: the delete then waits for the generation's
            // end. A second delete waits alongside the first.
            Ending => matches!(to, Ended | Live | Paused | Ending),
            // The first end recorded is the one reported.
            Ended => false,
        }
    }
}

/// A move the table refuses.
#[derive(Debug, thiserror::Error)]
#[error("the container's VM cannot move from {from:?} to {to:?}")]
pub(super) struct IllegalMove {
    from: Stage,
    to: Stage,
}

#[cfg(test)]
mod tests {
    use super::Phase;
    use super::Stage::{self, *};

    const ALL: [Stage; 6] = [Starting, Live, Pausing, Paused, Ending, Ended];

    /// Every move the VM may make, written out independently of the table.
    const ALLOWED: &[(Stage, Stage)] = &[
        (Starting, Live),
        (Starting, Ended),
        (Starting, Paused),
        (Starting, Ending),
        (Live, Pausing),
        (Live, Ending),
        (Live, Ended),
        (Pausing, Paused),
        (Pausing, Live),
        (Pausing, Ended),
        (Pausing, Ending),
        (Paused, Starting),
        (Paused, Ending),
        (Paused, Ended),
        (Ending, Ended),
        (Ending, Live),
        (Ending, Paused),
        (Ending, Ending),
    ];

    fn phase(stage: Stage) -> Phase {
        match stage {
            Starting => Phase::Starting,
            Live => Phase::Live,
            Pausing => Phase::Pausing,
            Paused => Phase::Paused { checkpoint: "c".into() },
            Ending => Phase::Ended { summary: None },
            Ended => Phase::Ended { summary: Some("ended".into()) },
        }
    }

    #[test]
    fn every_pair_is_decided_by_the_table() {
        for from in ALL {
            assert_eq!(phase(from).stage(), from);
            for to in ALL {
                let allowed = ALLOWED.contains(&(from, to));
                assert_eq!(from.can_move(to), allowed, "{from:?} -> {to:?}");
                let mut moving = phase(from);
                assert_eq!(moving.move_to(phase(to)).is_ok(), allowed, "{from:?} -> {to:?}");
                // A refused move leaves the VM where it stood.
                assert_eq!(moving.stage(), if allowed { to } else { from });
            }
        }
    }

    #[test]
    fn an_ended_vm_stays_ended_and_refusals_name_both_stages() {
        for to in ALL {
            assert!(!Ended.can_move(to));
        }
        let mut ended = phase(Ended);
        let e = ended.move_to(Phase::Ended { summary: Some("later".into()) }).unwrap_err();
        assert_eq!(e.to_string(), "the container's VM cannot move from Ended to Ended");
        assert!(matches!(&ended, Phase::Ended { summary: Some(s) } if s == "ended"), "the first end stands");
        // Only a live VM pauses, only a paused one resumes.
        assert_eq!(ALL.iter().filter(|s| s.can_move(Pausing)).collect::<Vec<_>>(), [&Live]);
        assert_eq!(ALL.iter().filter(|s| s.can_move(Starting)).collect::<Vec<_>>(), [&Paused]);
    }
}
