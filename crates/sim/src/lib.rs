//! pep-sim: deterministic discrete-event satellite link simulator driving two pep-transport
//! endpoints. The impairment models in [`channel`] are shared with pep-linkemu.

pub mod channel;
pub mod competitor;
pub mod jitter;
pub mod link;
pub mod report;
pub mod schedule;
pub mod sim;
pub mod timeline;
