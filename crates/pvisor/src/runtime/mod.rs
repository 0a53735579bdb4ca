//! The runtime's services over the records: the Job service and the
//! registry of live Attempts, workspace checkpoints, kill, gc and archives.

pub mod archive;
pub mod checkpoint;
pub mod gc;
pub mod job_service;
pub mod kill;
pub mod registry;
