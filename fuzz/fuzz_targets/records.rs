//! Every record parser, fed arbitrary bytes: job, run, attempt, Bundle,
//! receipt, checkpoint manifest, preimages, and Trace and ledger lines. None
//! may panic, and a receipt that parses is validated against the same bytes
//! as its Bundle (which must never be accepted unless the digest matches).
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use pvisor_core::event::Event;
use pvisor_core::records::{AttemptRecord, Bundle, CheckpointManifest, CompletionReceipt, JobRecord, RunRecord};
use pvisor_core::store::{blake3_hex, parse_record};
use pvisor_stage::ledger::LedgerRecord;
use pvisor_stage::preimage::Preimages;

fuzz_target!(|data: &[u8]| {
    let p = Path::new("fuzz.json");
    let _ = parse_record::<JobRecord>(p, data);
    let _ = parse_record::<RunRecord>(p, data);
    let _ = parse_record::<AttemptRecord>(p, data);
    let _ = parse_record::<Bundle>(p, data);
    let _ = parse_record::<CheckpointManifest>(p, data);
    let _ = parse_record::<Preimages>(p, data);
    for line in data.split(|&b| b == b'\n') {
        let _ = serde_json::from_slice::<Event>(line);
        let _ = serde_json::from_slice::<LedgerRecord>(line);
    }
    if let Ok(receipt) = parse_record::<CompletionReceipt>(p, data) {
        let verdict = pvisor::validate_receipt(&receipt, &receipt.job, &receipt.attempt, "r", "b", data);
        if verdict.is_ok() {
            assert_eq!(receipt.bundle.blake3, blake3_hex(data), "accepted a Bundle whose digest differs");
        }
    }
});
