//! The runtime's durable machinery: Attempt records, completion receipts, the
//! registry of live Attempts, and the Job service.

pub mod archive;
pub mod attempt;
pub mod checkpoint;
pub mod completion;
pub mod gc;
pub mod job_service;
pub mod kill;
pub mod recovery;
pub mod registry;
pub mod suspension;
