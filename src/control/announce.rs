//! Announcements: a `blackhole` route in a kernel table (`[announce]`) for each subnet of
//! every terminal this hub serves, for a routing daemon to import and advertise, so that
//! the LAN sends a terminal's traffic to the hub that serves it. A terminal in an outage
//! keeps its routes, moved to `outage_table`, which the routing daemon advertises as less
//! preferred. The task follows the tunnel's state feed, gathers its changes for
//! [`COALESCE`] into one batch, and every [`RECONCILE`] compares the tables with what they
//! should hold, so that a lost change or a hand-made route is repaired.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use ipnet::IpNet;
use pep_transport::PeerId;
use tokio::sync::{mpsc, watch};
use tracing::{debug, warn};

use crate::config::AnnounceConfig;
use crate::metrics::AnnounceSnapshot;
use crate::sys::route_table::{self, Change, Marker, RouteTableError};
use crate::tunnel::gateway::Gateway;
use crate::tunnel::peer::AssociationState;
use crate::tunnel::state_feed::StateChange;

/// How long changes are gathered before one batch applies them: a hub restarting sees its
/// terminals associate within moments of each other.
pub const COALESCE: Duration = Duration::from_millis(50);
/// How often the tables are read and set right, and the most often a failure is logged.
pub const RECONCILE: Duration = Duration::from_secs(10);
/// State changes that may wait for the task; more are dropped and left to the next
/// reconcile. Room for every peer of a full hub to change once.
pub const FEED_CAPACITY: usize = crate::config::MAX_PEERS;

/// What the metrics show of the announcements.
#[derive(Debug, Default)]
pub struct AnnounceCounters {
    serving: AtomicU64,
    outage: AtomicU64,
    errors: AtomicU64,
}

impl AnnounceCounters {
    pub fn snapshot(&self) -> AnnounceSnapshot {
        AnnounceSnapshot {
            serving: self.serving.load(Ordering::Relaxed),
            outage: self.outage.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
        }
    }
}

/// The routes the tables should hold, and how many are there for each reason.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Wanted {
    pub markers: BTreeSet<Marker>,
    pub serving: u64,
    pub outage: u64,
}

/// The routes for peers in these states with these subnets: an established one's in
/// `table`, one in an outage's in `outage_table`, none for any other.
pub fn wanted<'a>(
    cfg: &AnnounceConfig,
    peers: impl IntoIterator<Item = (AssociationState, &'a [IpNet])>,
) -> Wanted {
    let mut w = Wanted::default();
    for (state, subnets) in peers {
        let (table, count) = match state {
            AssociationState::Established => (cfg.table, &mut w.serving),
            AssociationState::Outage => (cfg.outage_table(), &mut w.outage),
            AssociationState::Connecting | AssociationState::Closed => continue,
        };
        for &net in subnets {
            w.markers.insert(Marker { table, net });
            *count += 1;
        }
    }
    w
}

/// The batch that takes the tables from `have` to `want`. Additions come first, so that a
/// prefix moving between the tables is announced from one of them throughout.
pub fn changes(have: &BTreeSet<Marker>, want: &BTreeSet<Marker>) -> Vec<Change> {
    let put = want.difference(have).copied().map(Change::Put);
    let remove = have.difference(want).copied().map(Change::Remove);
    put.chain(remove).collect()
}

/// Empties every table of `cfg`: at start, at exit, and for `pepd announce --flush`.
pub fn flush(cfg: &AnnounceConfig) -> anyhow::Result<()> {
    for table in cfg.tables() {
        route_table::flush(table)
            .with_context(|| format!("emptying announcement table {table}"))?;
    }
    Ok(())
}

/// Follows the peers' states into the tables until told to stop, then empties them.
pub struct Announcer {
    pub cfg: AnnounceConfig,
    pub gateway: Arc<Gateway>,
    pub counters: Arc<AnnounceCounters>,
}

/// What the task knows between batches.
struct Known {
    /// The last state each peer was reported in.
    states: HashMap<PeerId, AssociationState>,
    /// What the tables hold, as the last batch left them.
    announced: BTreeSet<Marker>,
    /// When a failure was last logged, and the failures since that went unlogged.
    logged: Option<Instant>,
    unlogged: u64,
}

impl Announcer {
    pub async fn run(
        self,
        mut feed: mpsc::Receiver<StateChange>,
        mut stop: watch::Receiver<bool>,
    ) -> anyhow::Result<()> {
        let mut known = Known {
            states: HashMap::new(),
            announced: BTreeSet::new(),
            logged: None,
            unlogged: 0,
        };
        let mut reconcile = tokio::time::interval(RECONCILE);
        reconcile.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut due: Option<tokio::time::Instant> = None;
        loop {
            let deadline = due.unwrap_or_else(|| tokio::time::Instant::now() + RECONCILE);
            tokio::select! {
                change = feed.recv() => match change {
                    Some((peer, state)) => {
                        known.states.insert(peer, state);
                        due.get_or_insert_with(|| tokio::time::Instant::now() + COALESCE);
                    }
                    None => break,
                },
                _ = tokio::time::sleep_until(deadline), if due.is_some() => {
                    due = None;
                    self.apply(&mut known).await;
                }
                _ = reconcile.tick() => {
                    due = None;
                    self.reconcile(&mut known).await;
                }
                r = stop.changed() => if r.is_err() || *stop.borrow() {
                    break;
                },
            }
        }
        self.counters.serving.store(0, Ordering::Relaxed);
        self.counters.outage.store(0, Ordering::Relaxed);
        let cfg = self.cfg;
        blocking(move || flush(&cfg)).await
    }

    /// What the tables should hold now: the peers configured now, in the states last
    /// reported (or read, for a peer not reported since the last reconcile).
    fn wanted(&self, known: &Known) -> Wanted {
        let table = self.gateway.peers.table();
        let states: Vec<AssociationState> = table
            .peers
            .iter()
            .map(|p| {
                known
                    .states
                    .get(&p.id)
                    .copied()
                    .unwrap_or_else(|| p.counters.state())
            })
            .collect();
        wanted(
            &self.cfg,
            states
                .into_iter()
                .zip(table.specs.iter().map(|s| s.subnets.as_slice())),
        )
    }

    /// Applies what changed since the last batch.
    async fn apply(&self, known: &mut Known) {
        let want = self.wanted(known);
        let batch = changes(&known.announced, &want.markers);
        debug!(changes = batch.len(), "announcements");
        let r = blocking(move || route_table::apply(&batch)).await;
        self.settle(known, want, r);
    }

    /// Reads the tables and sets them right, with every peer's state read afresh.
    async fn reconcile(&self, known: &mut Known) {
        let table = self.gateway.peers.table();
        known.states = table
            .peers
            .iter()
            .map(|p| (p.id, p.counters.state()))
            .collect();
        let want = self.wanted(known);
        let tables = self.cfg.tables();
        let read = blocking(move || {
            let mut have = BTreeSet::new();
            for table in tables {
                for net in route_table::read(table)? {
                    have.insert(Marker { table, net });
                }
            }
            Ok::<_, RouteTableError>(have)
        })
        .await;
        let have = match read {
            Ok(have) => have,
            Err(e) => {
                self.failed(known, &e);
                return;
            }
        };
        let batch = changes(&have, &want.markers);
        if !batch.is_empty() {
            debug!(changes = batch.len(), "announcement tables set right");
        }
        let r = blocking(move || route_table::apply(&batch)).await;
        self.settle(known, want, r);
    }

    /// Records a batch's outcome. After a failure the tables may differ from `want` in
    /// any of its lines; the next reconcile reads them and finds out.
    fn settle(&self, known: &mut Known, want: Wanted, r: Result<(), RouteTableError>) {
        if let Err(e) = r {
            self.failed(known, &e);
        }
        self.counters.serving.store(want.serving, Ordering::Relaxed);
        self.counters.outage.store(want.outage, Ordering::Relaxed);
        known.announced = want.markers;
    }

    /// Counts a failure; logs it unless one was logged within [`RECONCILE`].
    fn failed(&self, known: &mut Known, e: &RouteTableError) {
        self.counters.errors.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        if known
            .logged
            .is_some_and(|t| now.duration_since(t) < RECONCILE)
        {
            known.unlogged += 1;
            return;
        }
        warn!(
            error = %e,
            failures_unlogged = known.unlogged,
            "announcement tables: a change failed; set right at the next reconcile"
        );
        known.logged = Some(now);
        known.unlogged = 0;
    }
}

/// Runs `f` (which runs `ip`) off the runtime's threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(f).await {
        Ok(v) => v,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().expect(s)
    }

    fn marker(table: u32, s: &str) -> Marker {
        Marker { table, net: net(s) }
    }

    const TWO: AnnounceConfig = AnnounceConfig {
        table: 200,
        outage_table: Some(201),
    };

    #[test]
    fn established_terminals_are_served_and_those_in_an_outage_moved() {
        let a = [net("10.3.0.0/24"), net("fd00:198:19:3::/64")];
        let b = [net("10.7.0.0/24")];
        let c = [net("10.9.0.0/24")];
        let d = [net("10.11.0.0/24")];
        let peers = [
            (AssociationState::Established, &a[..]),
            (AssociationState::Outage, &b[..]),
            (AssociationState::Connecting, &c[..]),
            (AssociationState::Closed, &d[..]),
        ];
        let w = wanted(&TWO, peers);
        assert_eq!(
            w.markers,
            BTreeSet::from([
                marker(200, "10.3.0.0/24"),
                marker(200, "fd00:198:19:3::/64"),
                marker(201, "10.7.0.0/24"),
            ])
        );
        assert_eq!((w.serving, w.outage), (2, 1));
        // One table: an outage keeps the routes where they are, counted as outage.
        let one = AnnounceConfig {
            table: 200,
            outage_table: None,
        };
        let w = wanted(&one, peers);
        assert!(w.markers.contains(&marker(200, "10.7.0.0/24")));
        assert_eq!((w.serving, w.outage), (2, 1));
    }

    #[test]
    fn a_move_adds_before_it_removes_and_nothing_changes_twice() {
        let have = BTreeSet::from([marker(200, "10.3.0.0/24"), marker(200, "10.7.0.0/24")]);
        let want = BTreeSet::from([marker(201, "10.3.0.0/24"), marker(200, "10.7.0.0/24")]);
        assert_eq!(
            changes(&have, &want),
            [
                Change::Put(marker(201, "10.3.0.0/24")),
                Change::Remove(marker(200, "10.3.0.0/24")),
            ]
        );
        assert!(changes(&want, &want).is_empty());
        assert_eq!(
            changes(&want, &BTreeSet::new()),
            [
                Change::Remove(marker(200, "10.7.0.0/24")),
                Change::Remove(marker(201, "10.3.0.0/24")),
            ]
        );
    }
}
