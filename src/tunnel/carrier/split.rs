//! The carrier split between workers as the scheduler splits it between members, one level
//! up: each worker gets its active peers' CIRs, then the rest by their weights, none more
//! than its peers' MIRs, and what one cannot use goes to the others by weight.

use pep_transport::{allocations, MemberRates};

/// What one worker's peers ask of the carrier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Demand {
    pub cir_bps: u64,
    pub mir_bps: u64,
    /// Their weights added up; 0: nothing to send.
    pub weight: u64,
}

impl Demand {
    pub fn add(&mut self, r: &MemberRates) {
        self.cir_bps = self.cir_bps.saturating_add(r.cir_bps);
        self.mir_bps = self.mir_bps.saturating_add(r.mir_bps.max(r.cir_bps));
        self.weight += u64::from(r.weight.max(1));
    }
}

/// Worker `me`'s part of `carrier_bps` when the workers ask `demands`: each worker counts
/// as one member of the scheduler's rule ([`pep_transport::allocations`]) with its peers'
/// rates added up.
pub fn part(carrier_bps: u64, demands: &[Demand], me: usize) -> u64 {
    let Some(mine) = demands.get(me) else {
        return 0;
    };
    if mine.weight == 0 {
        return 0;
    }
    let cir_total: u128 = demands.iter().map(|d| u128::from(d.cir_bps)).sum();
    if cir_total >= u128::from(carrier_bps) {
        // Over-committed (validation keeps the CIRs within the carrier): in proportion, so
        // that the workers' parts still add up to the carrier.
        return mul_div(carrier_bps, mine.cir_bps, cir_total);
    }
    let active: Vec<MemberRates> = demands
        .iter()
        .filter(|d| d.weight > 0)
        .map(|d| MemberRates {
            cir_bps: d.cir_bps,
            mir_bps: d.mir_bps,
            // Beyond 4 × 10⁹ the weights' ratio is off by a part in 10⁹ at most.
            weight: u32::try_from(d.weight).unwrap_or(u32::MAX),
        })
        .collect();
    let index = demands[..me].iter().filter(|d| d.weight > 0).count();
    allocations(carrier_bps, &active)
        .get(index)
        .copied()
        .unwrap_or(0)
}

fn mul_div(a: u64, b: u64, c: u128) -> u64 {
    if c == 0 {
        return 0;
    }
    u64::try_from(u128::from(a) * u128::from(b) / c).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1_000_000;

    fn d(cir: u64, mir: u64, weight: u64) -> Demand {
        Demand {
            cir_bps: cir * M,
            mir_bps: mir * M,
            weight,
        }
    }

    fn parts(carrier: u64, demands: &[Demand]) -> Vec<u64> {
        (0..demands.len())
            .map(|w| part(carrier * M, demands, w) / M)
            .collect()
    }

    #[test]
    fn equal_workers_split_evenly_and_an_idle_one_leaves_its_part() {
        assert_eq!(parts(100, &[d(0, 100, 2), d(0, 100, 2)]), [50, 50]);
        assert_eq!(parts(100, &[d(0, 100, 2), Demand::default()]), [100, 0]);
    }

    #[test]
    fn cirs_first_then_weights() {
        // 30 committed on worker 0, the 70 left 1:3 by weight.
        let p = parts(100, &[d(30, 100, 1), d(0, 100, 3)]);
        assert_eq!(p, [30 + 17, 52]);
    }

    #[test]
    fn a_capped_worker_leaves_the_rest_to_the_others() {
        // Worker 0's peers may take 10 at most; 1 and 2 share the 90 left 1:2.
        assert_eq!(
            parts(100, &[d(0, 10, 5), d(0, 100, 1), d(0, 100, 2)]),
            [10, 30, 60]
        );
        // Everyone capped: the carrier is not all used.
        assert_eq!(parts(100, &[d(0, 10, 1), d(5, 20, 1)]), [10, 20]);
    }

    #[test]
    fn over_committed_cirs_go_in_proportion() {
        assert_eq!(parts(100, &[d(150, 150, 1), d(50, 50, 1)]), [75, 25]);
        assert_eq!(part(100, &[], 0), 0);
    }

    #[test]
    fn weights_beyond_u32_still_split_by_weight() {
        let huge = u64::from(u32::MAX) * 4;
        let p = parts(100, &[d(0, 100, huge), d(0, 100, 1)]);
        assert_eq!(
            p,
            [99, 0],
            "beside the first worker's weight, the second's rounds to nothing"
        );
    }
}
