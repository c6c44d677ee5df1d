//! pep-sim: deterministic discrete-event satellite link simulator.
pub mod channel;
