//! pepd: the performance-enhancing proxy daemon. This crate is a thin I/O shell around the
//! sans-IO transport in `pep-transport`: TPROXY interception, the TCP relays, the tunnel
//! socket and the timers that drive the association.

mod bypass;
pub mod config;
pub mod daemon;
mod driver;
mod droplog;
pub mod fdlimit;
mod flowcount;
mod gateway;
pub mod keys;
mod link;
pub mod memory;
pub mod metrics;
mod notify;
mod peers;
mod relay;
mod reload;
pub mod routes;
pub mod rules;
mod scratch;
pub mod selfcheck;
mod share;
mod sockopt;
mod tproxy;
mod tunnel;
mod upstream;
mod workers;
