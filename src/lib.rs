//! pepd: the performance-enhancing proxy daemon. This crate is a thin I/O shell around the
//! sans-IO transport in `pep-transport`; docs/ARCHITECTURE.md maps its rooms: the control
//! plane, the tunnel (UDP), the proxy (TCP), metrics and config.

pub mod config;
pub mod control;
pub mod metrics;
pub mod proxy;
pub mod sys;
pub mod tunnel;
