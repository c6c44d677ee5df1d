//! What pepd asks of the operating system that the standard wrappers do not cover: socket
//! options, systemd's notifications, and serving a listener's connections with a bound.
//! Imports nothing of pepd.

pub mod notify;
pub mod serve;
pub mod sockopt;
