//! The control plane: `pepd run` (start, signals, drain, watchdog), reload, the start-up
//! self-check, the interception rules, the open-file limit and `check-config`'s report.

pub mod fdlimit;
pub mod reload;
pub mod report;
pub mod rules;
pub mod run;
pub mod selfcheck;
pub mod signals;
