//! The settings relays and acceptors read per connection, which a reload replaces.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::config::{FailMode, OverLimit, PepdConfig};
use crate::proxy::upstream::UpstreamOptions;

/// Settings relays and acceptors read per connection; SIGHUP replaces them.
#[derive(Debug, Clone)]
pub struct Live {
    pub over_limit: OverLimit,
    /// What a connection that no peer's subnets hold gets (`[rules] fail`).
    pub fail: FailMode,
    pub upstream: UpstreamOptions,
    pub idle: Option<Duration>,
    /// `limits.stalled_flow_timeout`, `None` when disabled.
    pub stalled_flow_timeout: Option<Duration>,
    /// SIGTERM received: new connections are refused while open ones finish.
    pub draining: bool,
}

impl Live {
    pub fn from_config(cfg: &PepdConfig) -> Live {
        Live {
            over_limit: cfg.limits.over_limit,
            fail: cfg.rules.fail,
            upstream: UpstreamOptions {
                mark: cfg.intercept.own_mark,
                transparent_source: cfg.upstream.transparent_source,
                connect_timeout: cfg.timeouts.connect,
            },
            idle: (!cfg.timeouts.idle.is_zero()).then_some(cfg.timeouts.idle),
            stalled_flow_timeout: Some(cfg.limits.stalled_flow_timeout).filter(|t| !t.is_zero()),
            draining: false,
        }
    }
}

pub type LiveRef = Arc<RwLock<Live>>;

/// The settings now, for one connection.
pub fn read(live: &LiveRef) -> Live {
    live.read().unwrap_or_else(|p| p.into_inner()).clone()
}
