//! What each member may use of the carrier: its CIR, plus a weighted share of what the CIRs
//! leave, capped at its MIR, with the share of capped members going to the others
//! (water-filling). Exact integer arithmetic: allocations are bit/s.

use super::MemberRates;

/// The level that the weighted shares of the uncapped members reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WaterLevel {
    /// The MIRs of all active members fit into the carrier.
    EveryoneAtMir,
    /// Each uncapped member gets `spare_bps × weight / weight_sum` above its CIR.
    Shared { spare_bps: u128, weight_sum: u128 },
}

fn headroom(r: &MemberRates) -> u128 {
    u128::from(r.mir_bps - r.cir_bps)
}

/// Water level for `active` (normalised rates: `weight ≥ 1`, `mir ≥ cir`) sharing
/// `carrier_bps`. Sorts `active`.
pub(super) fn water_level(carrier_bps: u64, active: &mut [MemberRates]) -> WaterLevel {
    let cir_sum: u128 = active.iter().map(|r| u128::from(r.cir_bps)).sum();
    let Some(mut spare) = u128::from(carrier_bps).checked_sub(cir_sum) else {
        // CIRs above the carrier (check-config refuses this): nobody gets more than its CIR.
        return WaterLevel::Shared {
            spare_bps: 0,
            weight_sum: 1,
        };
    };
    let mut weights: u128 = active.iter().map(|r| u128::from(r.weight)).sum();
    // Members reach their MIR in order of headroom per unit of weight.
    active.sort_by(|a, b| {
        (headroom(a) * u128::from(b.weight)).cmp(&(headroom(b) * u128::from(a.weight)))
    });
    for r in active.iter() {
        let w = u128::from(r.weight);
        if headroom(r) * weights > spare * w {
            break;
        }
        spare -= headroom(r);
        weights -= w;
    }
    if weights == 0 {
        WaterLevel::EveryoneAtMir
    } else {
        WaterLevel::Shared {
            spare_bps: spare,
            weight_sum: weights,
        }
    }
}

/// What a member with `rates` may use at `level`: at least its CIR, at most its MIR.
pub(super) fn allocation(rates: &MemberRates, level: WaterLevel, carrier_bps: u64) -> u64 {
    match level {
        WaterLevel::EveryoneAtMir => rates.mir_bps.min(carrier_bps.max(rates.cir_bps)),
        WaterLevel::Shared {
            spare_bps,
            weight_sum,
        } => {
            let share = spare_bps * u128::from(rates.weight) / weight_sum;
            let above_cir = u64::try_from(share).unwrap_or(u64::MAX);
            rates.cir_bps.saturating_add(above_cir).min(rates.mir_bps)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::allocations;

    fn rates(cir_bps: u64, mir_bps: u64, weight: u32) -> MemberRates {
        MemberRates {
            cir_bps,
            mir_bps,
            weight,
        }
    }

    #[test]
    fn cir_then_weighted_remainder() {
        let m = [rates(4_000_000, 10_000_000, 1), rates(0, 10_000_000, 1)];
        assert_eq!(allocations(10_000_000, &m), [7_000_000, 3_000_000]);
    }

    #[test]
    fn capped_member_leaves_its_share_to_the_others() {
        let m = [
            rates(0, 1_000_000, 1),
            rates(0, 100_000_000, 1),
            rates(0, 100_000_000, 2),
        ];
        assert_eq!(
            allocations(10_000_000, &m),
            [1_000_000, 3_000_000, 6_000_000]
        );
    }

    #[test]
    fn mirs_that_fit_are_all_met() {
        let m = [rates(0, 2_000_000, 1), rates(1_000_000, 3_000_000, 5)];
        assert_eq!(allocations(10_000_000, &m), [2_000_000, 3_000_000]);
        assert_eq!(allocations(10_000_000, &[]), Vec::<u64>::new());
    }

    #[test]
    fn alone_gets_min_of_mir_and_carrier() {
        assert_eq!(
            allocations(10_000_000, &[rates(0, 4_000_000, 3)]),
            [4_000_000]
        );
        assert_eq!(
            allocations(10_000_000, &[rates(0, 40_000_000, 3)]),
            [10_000_000]
        );
    }

    #[test]
    fn weights_of_zero_count_as_one_and_a_mir_below_the_cir_as_the_cir() {
        let m = [rates(0, 10_000_000, 0), rates(3_000_000, 0, 1)];
        assert_eq!(allocations(10_000_000, &m), [7_000_000, 3_000_000]);
    }

    #[test]
    fn cirs_above_the_carrier_give_each_its_cir() {
        let m = [
            rates(6_000_000, 9_000_000, 1),
            rates(6_000_000, 9_000_000, 1),
        ];
        assert_eq!(allocations(10_000_000, &m), [6_000_000, 6_000_000]);
    }
}
