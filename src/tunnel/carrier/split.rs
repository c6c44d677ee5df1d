//! The carrier split between a hub's workers, terminal by terminal: each worker publishes
//! its members as they count towards the shares (the scheduler's activity window and demand
//! headroom, [`pep_transport::Counted`]), and the shares are the scheduler's water-filling
//! over all of them ([`Shares`]), as one scheduler over every terminal would make them. A
//! terminal's share so does not depend on which worker serves it nor on what the others
//! there do, and a worker's part of the carrier is its terminals' shares added up.

use std::time::Instant;

use pep_transport::{Counted, MemberRates, Shares};

/// What the workers last published, by worker: each of its members that counts towards the
/// shares, and until when. A worker's loop may sleep long after its last send (a
/// keepalive), so what it published expires by itself.
pub struct Board {
    by_worker: Vec<Vec<(MemberRates, Instant)>>,
}

impl Board {
    pub fn new(workers: usize) -> Board {
        Board {
            by_worker: vec![Vec::new(); workers.max(1)],
        }
    }

    /// `worker`'s members that count, in place of what it published before.
    pub fn publish(&mut self, worker: usize, members: &[Counted]) {
        if let Some(mine) = self.by_worker.get_mut(worker) {
            mine.clear();
            mine.extend(members.iter().map(|c| (c.rates, c.until)));
        }
    }

    /// The rates of every member of every worker that counts at `now`, into `out` (cleared
    /// first).
    pub fn counting(&self, now: Instant, out: &mut Vec<MemberRates>) {
        out.clear();
        out.extend(
            self.by_worker
                .iter()
                .flatten()
                .filter(|&&(_, until)| until > now)
                .map(|&(rates, _)| rates),
        );
    }
}

/// A worker's part of `carrier_bps` at `shares`: the shares of its members that count (at
/// their own rates, `own`) added up, at most the carrier. A member counted below its share
/// (a light one, or one speeding up) has its share in the part as its ceiling has it, so
/// it is not held to its demand while the ceilings hold the busy ones to theirs.
pub fn part<'a>(
    shares: &Shares,
    carrier_bps: u64,
    own: impl IntoIterator<Item = &'a MemberRates>,
) -> u64 {
    own.into_iter()
        .map(|r| shares.allocation(r))
        .fold(0u64, u64::saturating_add)
        .min(carrier_bps)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use pep_transport::{allocations, CarrierScheduler};

    use super::*;

    const M: u64 = 1_000_000;

    fn rates(cir: u64, mir: u64, weight: u32) -> MemberRates {
        MemberRates {
            cir_bps: cir * M,
            mir_bps: mir * M,
            weight,
        }
    }

    /// `members` as a worker publishes them, counting until `until`.
    fn counted(members: &[MemberRates], until: Instant) -> Vec<Counted> {
        let mut ids = CarrierScheduler::new(M, 1500);
        members
            .iter()
            .map(|&r| Counted {
                id: ids.add_member(r),
                rates: r,
                until,
            })
            .collect()
    }

    /// By worker, its members as (counted, own rates): each member's share as its worker
    /// sees it, and each worker's part.
    type Worker = Vec<(MemberRates, MemberRates)>;

    fn split(carrier: u64, by_worker: &[Worker]) -> (Vec<u64>, Vec<u64>) {
        let now = Instant::now();
        let mut board = Board::new(by_worker.len());
        for (w, members) in by_worker.iter().enumerate() {
            let published: Vec<MemberRates> = members.iter().map(|m| m.0).collect();
            board.publish(w, &counted(&published, now + Duration::from_millis(200)));
        }
        let mut counting = Vec::new();
        board.counting(now, &mut counting);
        let shares = Shares::of(carrier * M, &mut counting);
        let each = by_worker
            .iter()
            .flatten()
            .map(|(_, own)| shares.allocation(own))
            .collect();
        let parts = by_worker
            .iter()
            .map(|members| part(&shares, carrier * M, members.iter().map(|m| &m.1)))
            .collect();
        (each, parts)
    }

    fn at_own(members: &[MemberRates]) -> Worker {
        members.iter().map(|&r| (r, r)).collect()
    }

    #[test]
    fn a_light_terminal_leaves_its_share_to_all_and_has_it_as_its_ceiling_on_any_worker() {
        // The testbed's hub check: terminals 1, 4 and 6 busy, 2 light (counted at its
        // floor), the others idle; on two workers by id, and on three.
        let busy = rates(0, 20, 1);
        let light = MemberRates {
            mir_bps: 120_000,
            ..busy
        };
        let level = (20 * M - 120_000) / 3;
        assert_eq!(
            allocations(20 * M, &[busy, light, busy, busy]),
            [level, 120_000, level, level]
        );
        let (each, parts) = split(
            20,
            &[
                at_own(&[busy]),
                vec![(light, busy), (busy, busy), (busy, busy)],
            ],
        );
        assert_eq!(each, [level; 4]);
        assert_eq!(parts, [level, 3 * level]);
        let (each, parts) = split(
            20,
            &[
                vec![(busy, busy), (light, busy)],
                at_own(&[busy]),
                at_own(&[busy]),
            ],
        );
        assert_eq!(each, [level; 4]);
        assert_eq!(parts, [2 * level, level, level]);
    }

    #[test]
    fn cirs_mirs_and_weights_as_one_scheduler_over_all_terminals() {
        let members = [
            rates(5, 100, 1),
            rates(0, 8, 2),
            rates(0, 100, 2),
            rates(10, 12, 1),
            rates(0, 100, 1),
            rates(0, 3, 5),
        ];
        let single = allocations(100 * M, &members);
        for workers in [1, 2, 4, 8] {
            // Unevenly: worker 0 has one, the last the rest, the others none.
            let mut by_worker = vec![Vec::new(); workers];
            by_worker[0] = at_own(&members[..1]);
            by_worker[workers - 1].extend(at_own(&members[1..]));
            let (each, parts) = split(100, &by_worker);
            assert_eq!(each, single, "{workers} workers");
            let sum: u64 = parts.iter().sum();
            assert!(sum.abs_diff(100 * M) <= 2, "{workers} workers: {parts:?}");
        }
    }

    #[test]
    fn a_part_is_at_most_the_carrier() {
        let (_, parts) = split(10, &[at_own(&[rates(0, 10, 1); 3])]);
        assert_eq!(parts, [10 * M - 1]);
        let (_, parts) = split(10, &[at_own(&[rates(6, 10, 1), rates(6, 10, 1)])]);
        assert_eq!(parts, [10 * M], "CIRs above the carrier give each its CIR");
    }

    #[test]
    fn what_a_worker_published_counts_until_it_expires_and_is_replaced_whole() {
        let now = Instant::now();
        let mut board = Board::new(2);
        let busy = [rates(0, 100, 1)];
        board.publish(0, &counted(&busy, now + Duration::from_millis(50)));
        board.publish(
            1,
            &counted(&[busy[0], busy[0]], now + Duration::from_millis(150)),
        );
        let mut out = Vec::new();
        board.counting(now, &mut out);
        assert_eq!(out.len(), 3);
        board.counting(now + Duration::from_millis(50), &mut out);
        assert_eq!(out.len(), 2);
        board.publish(1, &[]);
        board.counting(now, &mut out);
        assert_eq!(out.len(), 1);
        // An unknown worker's publication is ignored.
        board.publish(7, &counted(&busy, now + Duration::from_secs(1)));
        board.counting(now, &mut out);
        assert_eq!(out.len(), 1);
    }
}
