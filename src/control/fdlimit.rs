//! The open-file limit `limits.max_flows` needs: raised at start as far as the hard limit
//! allows, and the flow limit cut to what the descriptors can serve when it is lower.
//!
//! What holds a descriptor, counted:
//! - each proxied flow: one TCP socket (the client's on the side that intercepted it, the
//!   destination's on the other); the flow's tunnel traffic shares the one UDP socket;
//! - each connection beyond `max_flows`: one while it is reset (`over_limit = "refuse"`),
//!   two while it is relayed (`"bypass"`, client and destination). Bypassed connections
//!   have no limit of their own; room for as many as `max_flows` is kept for them;
//! - fixed: stdio, the tunnel socket, the listeners, the metrics listener and its scrapes,
//!   the runtime's epoll and wakers, the signal pipe, the self-check's and systemd's
//!   short-lived ones. [`FIXED`] covers them with room to spare (measured: 15 once it runs, tests/limits.rs).

use nix::sys::resource::{getrlimit, setrlimit, Resource};

use crate::config::{OverLimit, PepdConfig};

/// Descriptors that do not depend on the number of flows.
pub const FIXED: u64 = 64;

/// Room for connections being reset at the limit (`over_limit = "refuse"`): a burst of
/// accepts the limit turns away, each open until its reset is sent.
pub const REFUSING: u64 = 256;

/// Descriptors each flow accounts for: its own socket, and with `bypass` two for a
/// connection over the limit.
pub fn per_flow(over_limit: OverLimit) -> u64 {
    match over_limit {
        OverLimit::Refuse => 1,
        OverLimit::Bypass => 3,
    }
}

/// What `max_flows` flows need.
pub fn needed(max_flows: u64, over_limit: OverLimit) -> u64 {
    let refusing = match over_limit {
        OverLimit::Refuse => REFUSING,
        OverLimit::Bypass => 0,
    };
    FIXED + refusing + per_flow(over_limit) * max_flows
}

/// The most flows `limit` descriptors serve (the inverse of [`needed`]).
pub fn flows_within(limit: u64, over_limit: OverLimit) -> u64 {
    let refusing = match over_limit {
        OverLimit::Refuse => REFUSING,
        OverLimit::Bypass => 0,
    };
    limit.saturating_sub(FIXED + refusing) / per_flow(over_limit)
}

/// What to do with the limits `(soft, hard)` for `need` descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// The soft limit to set, if it must rise (it is never lowered).
    pub raise_to: Option<u64>,
    /// The limit pepd will run with.
    pub limit: u64,
}

pub fn plan(soft: u64, hard: u64, need: u64) -> Plan {
    if soft >= need {
        return Plan {
            raise_to: None,
            limit: soft,
        };
    }
    let target = need.min(hard);
    Plan {
        raise_to: (target > soft).then_some(target),
        limit: target.max(soft),
    }
}

/// The outcome of [`raise`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Raised {
    pub soft_before: u64,
    pub hard: u64,
    /// The soft limit now.
    pub limit: u64,
    /// Flows that limit serves, `max_flows` or fewer.
    pub flows: u64,
}

/// Raises the soft open-file limit to what `cfg`'s limits need, as far as the hard limit
/// allows. `Err` only when the limits cannot be read or set.
pub fn raise(cfg: &PepdConfig) -> nix::Result<Raised> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    let over = cfg.limits.over_limit;
    let max_flows = cfg.limits.max_flows as u64;
    let p = plan(soft, hard, needed(max_flows, over));
    if let Some(to) = p.raise_to {
        setrlimit(Resource::RLIMIT_NOFILE, to, hard)?;
    }
    Ok(Raised {
        soft_before: soft,
        hard,
        limit: p.limit,
        flows: max_flows.min(flows_within(p.limit, over)),
    })
}

/// `max_flows` as the current open-file limit lets it be served (for a reload, which
/// does not raise the limit again).
pub fn served(max_flows: usize, over_limit: OverLimit) -> usize {
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, _)) => {
            let within = usize::try_from(flows_within(soft, over_limit)).unwrap_or(usize::MAX);
            max_flows.min(within).max(1)
        }
        Err(_) => max_flows,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_for_the_default_limits() {
        // 10,000 flows refusing the rest: 64 + 256 + 10,000.
        assert_eq!(needed(10_000, OverLimit::Refuse), 10_320);
        // Bypassing: 64 + 3 × 10,000.
        assert_eq!(needed(10_000, OverLimit::Bypass), 30_064);
        assert_eq!(flows_within(10_320, OverLimit::Refuse), 10_000);
        assert_eq!(flows_within(10_319, OverLimit::Refuse), 9_999);
        assert_eq!(flows_within(30_064, OverLimit::Bypass), 10_000);
        assert_eq!(flows_within(30_063, OverLimit::Bypass), 9_999);
        // The usual soft limit of 1024 serves 704 flows, or 320 bypassing.
        assert_eq!(flows_within(1024, OverLimit::Refuse), 704);
        assert_eq!(flows_within(1024, OverLimit::Bypass), 320);
        assert_eq!(flows_within(100, OverLimit::Refuse), 0);
    }

    #[test]
    fn the_soft_limit_rises_to_the_need_within_the_hard_limit() {
        // systemd's defaults: soft 1024, hard 524288.
        assert_eq!(
            plan(1024, 524_288, 10_320),
            Plan {
                raise_to: Some(10_320),
                limit: 10_320
            }
        );
        // Already enough: left alone, never lowered.
        assert_eq!(
            plan(65_536, 524_288, 10_320),
            Plan {
                raise_to: None,
                limit: 65_536
            }
        );
        // A hard limit below the need: up to it.
        assert_eq!(
            plan(1024, 4096, 10_320),
            Plan {
                raise_to: Some(4096),
                limit: 4096
            }
        );
        // Soft already at a hard limit that is too low: nothing to raise.
        assert_eq!(
            plan(4096, 4096, 10_320),
            Plan {
                raise_to: None,
                limit: 4096
            }
        );
    }

    #[test]
    fn raising_for_the_config_leaves_this_process_serving_it() {
        // Only ever raises the soft limit, within the hard one: harmless to the other
        // tests in this process.
        let cfg = PepdConfig::parse(include_str!("../../config/terminal.toml")).expect("config");
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
        let r = raise(&cfg).expect("raise");
        let need = needed(cfg.limits.max_flows as u64, cfg.limits.over_limit);
        assert_eq!((r.soft_before, r.hard), (soft, hard));
        assert_eq!(r.limit, soft.max(need.min(hard)));
        assert_eq!(
            getrlimit(Resource::RLIMIT_NOFILE).expect("again").0,
            r.limit
        );
        assert_eq!(
            r.flows,
            (cfg.limits.max_flows as u64).min(flows_within(r.limit, cfg.limits.over_limit))
        );
        assert_eq!(
            served(cfg.limits.max_flows, cfg.limits.over_limit) as u64,
            r.flows
        );
    }
}
