//! The control plane: `pepd run` (start, signals, drain, watchdog), reload, the health
//! check (`/healthz`, `pepd health`), the announcements of the terminals a hub serves, the
//! start-up self-check, the interception rules, the open-file limit, `check-config`'s
//! report, and the status report with the control socket that serves it to `pepd status`.

pub mod announce;
pub mod client;
pub mod fdlimit;
pub mod health;
pub mod protocol;
pub mod reload;
pub mod report;
pub mod rules;
pub mod run;
pub mod screen;
pub mod selfcheck;
pub mod signals;
pub mod socket;
pub mod status;
