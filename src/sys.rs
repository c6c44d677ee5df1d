//! What pepd asks of the operating system that the standard wrappers do not cover: socket
//! options and systemd's notifications. Imports nothing of pepd.

pub mod notify;
pub mod sockopt;
