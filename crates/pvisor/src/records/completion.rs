//! Completion receipts: the only proof that an Attempt completed.
//!
//! A receipt (`completion.json`) binds the Attempt's [`RunResult`] to the
//! BLAKE3 digest of the exact Bundle bytes. It is committed no-clobber:
//! committing the same receipt again is a no-op, a different one is refused.
//! [`validate`] is what every reader runs before trusting a result.

use pvisor_core::ids::{AttemptId, JobId};
use pvisor_core::records::{Bundle, BundleRef, CompletionReceipt, RunResult, FORMAT};
use pvisor_core::state::ResultState;
use pvisor_core::store::{self, Commit, Store, StoreError};
use pvisor_core::time::Timestamp;

/// Why a receipt cannot be trusted. Each names the file at fault.
#[derive(Debug, thiserror::Error)]
pub enum ReceiptError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("Receipt {path} names {found}, but belongs to {expected}")]
    ForeignIdentity { path: String, found: String, expected: String },
    #[error("Receipt {path} is inconsistent: {reason}")]
    Inconsistent { path: String, reason: String },
    #[error("Receipt {path} is inconsistent: {source}")]
    IncoherentResult {
        path: String,
        #[source]
        source: ResultError,
    },
    #[error("Bundle {path} does not match its receipt: {reason}")]
    DigestMismatch { path: String, reason: String },
    #[error("Receipt {path} exists but its Bundle {bundle} is missing")]
    MissingBundle { path: String, bundle: String },
}

/// How a recorded result is not a coherent terminal result.
#[derive(Debug, thiserror::Error)]
pub enum ResultError {
    #[error("started_at {started_at} is after finished_at {finished_at}")]
    StartedAfterFinished { started_at: Timestamp, finished_at: Timestamp },
    #[error("exit code {0} is outside 0..=255")]
    ExitCodeOutOfRange(i32),
    #[error("both an exit code and a signal are recorded")]
    ExitCodeAndSignal,
    #[error("state completed with exit code {0:?}")]
    CompletedWithFailure(Option<i32>),
    #[error("state failed with exit code 0 and no error")]
    FailedWithoutFailure,
}

/// Builds the receipt for `result` and the Bundle's bytes.
pub fn build(job: &JobId, attempt: &AttemptId, result: &RunResult, bundle_bytes: &[u8]) -> CompletionReceipt {
    CompletionReceipt {
        format: FORMAT,
        job: job.clone(),
        run: attempt.run().clone(),
        attempt: attempt.clone(),
        result: result.clone(),
        bundle: BundleRef {
            file: "bundle.json".into(),
            size: bundle_bytes.len() as u64,
            blake3: store::blake3_hex(bundle_bytes),
        },
    }
}

/// Checks that a result is a coherent terminal result.
fn check_result(result: &RunResult) -> Result<(), ResultError> {
    if result.started_at > result.finished_at {
        return Err(ResultError::StartedAfterFinished {
            started_at: result.started_at,
            finished_at: result.finished_at,
        });
    }
    if let Some(code) = result.exit_code {
        if !(0..=255).contains(&code) {
            return Err(ResultError::ExitCodeOutOfRange(code));
        }
    }
    if result.exit_code.is_some() && result.signal.is_some() {
        return Err(ResultError::ExitCodeAndSignal);
    }
    match result.state {
        ResultState::Completed if result.exit_code != Some(0) || result.error.is_some() => {
            Err(ResultError::CompletedWithFailure(result.exit_code))
        }
        ResultState::Failed if result.exit_code == Some(0) && result.error.is_none() => {
            Err(ResultError::FailedWithoutFailure)
        }
        ResultState::Completed | ResultState::Failed | ResultState::Cancelled => Ok(()),
    }
}

/// Validates `receipt` for `attempt` of `job` against the Bundle's bytes:
/// identity, terminal state, exit code, start ≤ finish, size and digest, and
/// that the Bundle fixes the same result. Returns the Bundle it parsed: a
/// Bundle of 10,000 changes is 2 MB of JSON, not to be parsed twice.
pub fn validate(
    receipt: &CompletionReceipt,
    job: &JobId,
    attempt: &AttemptId,
    receipt_path: &str,
    bundle_path: &str,
    bundle_bytes: &[u8],
) -> Result<Bundle, ReceiptError> {
    let path = receipt_path.to_owned();
    if &receipt.job != job || &receipt.attempt != attempt || receipt.run != *attempt.run() {
        return Err(ReceiptError::ForeignIdentity {
            path,
            found: format!("{} / {}", receipt.job, receipt.attempt),
            expected: format!("{job} / {attempt}"),
        });
    }
    check_result(&receipt.result)
        .map_err(|source| ReceiptError::IncoherentResult { path: path.clone(), source })?;
    let mismatch = |reason: String| ReceiptError::DigestMismatch { path: bundle_path.to_owned(), reason };
    if receipt.bundle.size != bundle_bytes.len() as u64 {
        return Err(mismatch(format!(
            "receipt says {} bytes, file has {}",
            receipt.bundle.size,
            bundle_bytes.len()
        )));
    }
    let digest = store::blake3_hex(bundle_bytes);
    if digest != receipt.bundle.blake3 {
        return Err(mismatch(format!("blake3 is {digest}, receipt says {}", receipt.bundle.blake3)));
    }
    let bundle: Bundle = store::parse_record(std::path::Path::new(bundle_path), bundle_bytes)?;
    if &bundle.job != job || &bundle.attempt != attempt || bundle.result != receipt.result {
        return Err(ReceiptError::Inconsistent {
            path,
            reason: "the Bundle records a different identity or result".into(),
        });
    }
    Ok(bundle)
}

/// Loads and validates the receipt of `attempt`. `Ok(None)` means there is none.
pub fn load(
    store: &Store,
    job: &JobId,
    attempt: &AttemptId,
) -> Result<Option<(CompletionReceipt, Bundle)>, ReceiptError> {
    let receipt_path = store.receipt_file(attempt);
    let receipt: CompletionReceipt = match store::read_record(&receipt_path) {
        Ok(r) => r,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let bundle_path = store.attempt_dir(attempt).join(&receipt.bundle.file);
    if receipt.bundle.file.contains('/') || receipt.bundle.file.starts_with('.') {
        return Err(ReceiptError::Inconsistent {
            path: receipt_path.display().to_string(),
            reason: format!("bundle file name {:?} leaves the attempt directory", receipt.bundle.file),
        });
    }
    let bytes = match store::read_capped(&bundle_path, store::RECORD_READ_CAP) {
        Ok(b) => b,
        Err(e) if e.is_not_found() => {
            return Err(ReceiptError::MissingBundle {
                path: receipt_path.display().to_string(),
                bundle: bundle_path.display().to_string(),
            })
        }
        Err(e) => return Err(e.into()),
    };
    let bundle = validate(
        &receipt,
        job,
        attempt,
        &receipt_path.display().to_string(),
        &bundle_path.display().to_string(),
        &bytes,
    )?;
    Ok(Some((receipt, bundle)))
}

/// Commits `receipt` no-clobber. The same receipt again is [`Commit::AlreadyCommitted`].
pub fn commit(store: &Store, receipt: &CompletionReceipt) -> Result<Commit, StoreError> {
    store::commit_no_clobber(&store.receipt_file(&receipt.attempt), &store::to_json_bytes(receipt))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pvisor_core::ids::RunId;
    use pvisor_core::records::Observations;
    use pvisor_core::time::Timestamp;

    struct Fixture {
        _dir: tempfile::TempDir,
        store: Store,
        job: JobId,
        attempt: AttemptId,
        result: RunResult,
    }

    fn fixture(exit_code: i32) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let job = JobId::generate();
        let attempt = AttemptId::new(RunId::generate(), 1);
        store::create_dir_all_private(&store.attempt_dir(&attempt)).unwrap();
        let now = Timestamp::now();
        let result = RunResult {
            state: if exit_code == 0 { ResultState::Completed } else { ResultState::Failed },
            exit_code: Some(exit_code),
            signal: None,
            started_at: now,
            finished_at: now,
            error: None,
        };
        Fixture { _dir: dir, store, job, attempt, result }
    }

    fn save_bundle(f: &Fixture) -> Vec<u8> {
        let bundle = Bundle {
            format: FORMAT,
            job: f.job.clone(),
            run: f.attempt.run().clone(),
            attempt: f.attempt.clone(),
            result: f.result.clone(),
            observations: Observations::default(),
            changes: vec![],
            warnings: vec![],
            incomplete: None,
            binding: None,
        };
        let bytes = store::to_json_bytes(&bundle);
        std::fs::write(f.store.bundle_file(&f.attempt), &bytes).unwrap();
        bytes
    }

    #[test]
    fn committing_the_same_receipt_twice_is_idempotent_and_a_different_one_is_refused() {
        let f = fixture(3);
        let bytes = save_bundle(&f);
        let receipt = build(&f.job, &f.attempt, &f.result, &bytes);
        assert_eq!(commit(&f.store, &receipt).unwrap(), Commit::Written);
        assert_eq!(commit(&f.store, &receipt).unwrap(), Commit::AlreadyCommitted);
        let mut other = receipt.clone();
        other.result.exit_code = Some(0);
        other.result.state = ResultState::Completed;
        assert!(matches!(commit(&f.store, &other), Err(StoreError::Conflict { .. })));
        let (loaded, _) = load(&f.store, &f.job, &f.attempt).unwrap().unwrap();
        assert_eq!(loaded, receipt);
    }

    #[test]
    fn a_missing_receipt_is_none_not_an_error() {
        let f = fixture(0);
        save_bundle(&f);
        assert!(load(&f.store, &f.job, &f.attempt).unwrap().is_none());
    }

    #[test]
    fn a_tampered_bundle_fails_the_digest_check() {
        let f = fixture(0);
        let bytes = save_bundle(&f);
        commit(&f.store, &build(&f.job, &f.attempt, &f.result, &bytes)).unwrap();
        let mut tampered = bytes.clone();
        let pos = tampered.len() - 3;
        tampered[pos] ^= 1;
        std::fs::write(f.store.bundle_file(&f.attempt), &tampered).unwrap();
        let err = load(&f.store, &f.job, &f.attempt).unwrap_err();
        assert!(matches!(err, ReceiptError::DigestMismatch { .. }), "{err}");
        std::fs::remove_file(f.store.bundle_file(&f.attempt)).unwrap();
        assert!(matches!(load(&f.store, &f.job, &f.attempt), Err(ReceiptError::MissingBundle { .. })));
    }

    #[test]
    fn a_receipt_for_another_attempt_is_foreign() {
        let f = fixture(0);
        let bytes = save_bundle(&f);
        let stranger = AttemptId::new(RunId::generate(), 1);
        let receipt = build(&f.job, &stranger, &f.result, &bytes);
        let err = validate(&receipt, &f.job, &f.attempt, "r", "b", &bytes).unwrap_err();
        assert!(matches!(err, ReceiptError::ForeignIdentity { .. }), "{err}");
    }

    #[test]
    fn incoherent_results_are_rejected() {
        let f = fixture(0);
        let bytes = save_bundle(&f);
        let mut receipt = build(&f.job, &f.attempt, &f.result, &bytes);
        receipt.result.exit_code = Some(1);
        assert!(validate(&receipt, &f.job, &f.attempt, "r", "b", &bytes).is_err());
        let mut receipt = build(&f.job, &f.attempt, &f.result, &bytes);
        receipt.result.started_at =
            Timestamp::from(receipt.result.finished_at.system_time() + std::time::Duration::from_secs(5));
        let err = validate(&receipt, &f.job, &f.attempt, "r", "b", &bytes).unwrap_err();
        assert!(err.to_string().contains("after finished_at"), "{err}");
    }
}
