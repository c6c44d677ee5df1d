//! What pepd asks of the operating system that the standard wrappers do not cover: socket
//! options, systemd's notifications, serving a listener's connections with a bound, and a
//! kernel routing table of announcement routes.
//! Imports nothing of pepd.

pub mod notify;
pub mod route_table;
pub mod serve;
pub mod sockopt;
