use super::*;
use proptest::prelude::*;

const SECOND: Duration = Duration::from_secs(1);

fn rates(cir_bps: u64, mir_bps: u64, weight: u32) -> MemberRates {
    MemberRates {
        cir_bps,
        mir_bps,
        weight,
    }
}

/// Simulated time driving a scheduler the way a driver would: send whenever `next` names a
/// member, otherwise sleep until `poll_timeout`.
struct Run {
    sched: CarrierScheduler,
    t0: Instant,
    now: Instant,
    sends: Vec<(Duration, MemberId, usize)>,
}

impl Run {
    fn new(sched: CarrierScheduler) -> Self {
        let t0 = Instant::now();
        Run {
            sched,
            t0,
            now: t0,
            sends: Vec::new(),
        }
    }

    /// Runs until `until` (from the start); `size` is each member's next datagram.
    fn until(&mut self, until: Duration, mut size: impl FnMut(MemberId) -> Option<usize>) {
        let end = self.t0 + until;
        while self.now < end {
            if let Some(m) = self.sched.next(self.now, &mut size) {
                let bytes = size(m).expect("next named a member without data");
                self.sched.on_sent(self.now, m, bytes);
                self.sends.push((self.now - self.t0, m, bytes));
                continue;
            }
            match self.sched.poll_timeout(self.now) {
                Some(t) => {
                    assert!(t > self.now, "busy loop at {:?}", self.now - self.t0);
                    self.now = t;
                }
                None => self.now = end,
            }
        }
    }

    fn bytes(&self, m: MemberId, from: Duration, to: Duration) -> u64 {
        self.sends
            .iter()
            .filter(|(t, id, _)| *id == m && *t >= from && *t < to)
            .map(|(_, _, b)| *b as u64)
            .sum()
    }

    fn order(&self, n: usize) -> Vec<MemberId> {
        self.sends.iter().take(n).map(|(_, id, _)| *id).collect()
    }
}

#[test]
fn cir_served_before_weight_share() {
    // 1250-byte datagrams at 10 Mb/s: one per millisecond. A's CIR of 4 Mb/s takes every
    // 2.5 ms slot first; the other 6 Mb/s alternate between A and B (equal weights).
    let mut sched = CarrierScheduler::new(10_000_000, 1250);
    let a = sched.add_member(rates(4_000_000, 10_000_000, 1));
    let b = sched.add_member(rates(0, 10_000_000, 1));
    assert_eq!(sched.allocation(a), 7_000_000);
    assert_eq!(sched.allocation(b), 3_000_000);
    let mut run = Run::new(sched);
    run.until(10 * SECOND, |_| Some(1250));
    assert_eq!(run.sends.len(), 10_000);
    assert_eq!(run.bytes(a, Duration::ZERO, 10 * SECOND), 7000 * 1250);
    assert_eq!(run.bytes(b, Duration::ZERO, 10 * SECOND), 3000 * 1250);
    assert_eq!(run.sched.allocation(a), 7_000_000);
    assert_eq!(run.sched.allocation(b), 3_000_000);
}

#[test]
fn alone_gets_min_mir_carrier() {
    for (mir, expected) in [(4_000_000, 4_000_000), (40_000_000, 10_000_000)] {
        let mut sched = CarrierScheduler::new(10_000_000, 1250);
        let a = sched.add_member(rates(0, mir, 3));
        assert_eq!(sched.allocation(a), expected);
        let mut run = Run::new(sched);
        run.until(10 * SECOND, |_| Some(1250));
        // Paced from the first datagram at 0: exactly 10 s worth before 10 s.
        let bytes = expected * 10 / 8;
        assert_eq!(run.bytes(a, Duration::ZERO, 10 * SECOND), bytes, "{mir}");
        assert_eq!(run.sched.allocation(a), expected);
    }
}

/// Bytes of `m` in every window of `window` starting at one of its sends.
fn window_maxima(run: &Run, m: MemberId, window: Duration) -> u64 {
    let mine: Vec<(Duration, u64)> = run
        .sends
        .iter()
        .filter(|(_, id, _)| *id == m)
        .map(|(t, _, b)| (*t, *b as u64))
        .collect();
    let mut best = 0;
    let mut end = 0;
    let mut sum = 0;
    for start in 0..mine.len() {
        while end < mine.len() && mine[end].0 < mine[start].0 + window {
            sum += mine[end].1;
            end += 1;
        }
        best = best.max(sum);
        sum -= mine[start].1;
    }
    best
}

#[test]
fn never_more_than_mir_over_5s() {
    // A (MIR 3 Mb/s) beside a neighbour that would take the whole 100 Mb/s carrier, with a
    // 5 ms burst allowance and a 2 s pause that must not be made up afterwards.
    let mut sched = CarrierScheduler::new(100_000_000, 1250).with_burst(Duration::from_millis(5));
    let a = sched.add_member(rates(1_000_000, 3_000_000, 4));
    let b = sched.add_member(rates(0, 100_000_000, 1));
    let mut run = Run::new(sched);
    run.until(10 * SECOND, |_| Some(1250));
    run.until(12 * SECOND, |m| (m == b).then_some(1250));
    run.sched.wake(a);
    run.until(30 * SECOND, |_| Some(1250));
    // The schedule may lag by max(two datagrams, 5 ms at 3 Mb/s = 1875 bytes) and catch
    // up, plus the datagram that opens the window.
    let limit = 3_000_000 * 5 / 8 + 2 * 1250 + 1250;
    let most = window_maxima(&run, a, 5 * SECOND);
    assert!(most <= limit, "{most} > {limit}");
    assert!(most >= 3_000_000 * 5 / 8, "{most}");
    assert_eq!(run.sched.allocation(a), 3_000_000);
}

#[test]
fn weights_1_2_5_share_the_carrier_1_2_5() {
    let mut sched = CarrierScheduler::new(10_000_000, 1250);
    let ids: Vec<MemberId> = [1, 2, 5]
        .map(|w| sched.add_member(rates(0, 10_000_000, w)))
        .to_vec();
    let mut run = Run::new(sched);
    run.until(10 * SECOND, |_| Some(1250));
    let total = 10_000_000 * 10 / 8;
    for (id, w) in ids.iter().zip([1, 2, 5]) {
        let expected = total * w / 8;
        let got = run.bytes(*id, Duration::ZERO, 10 * SECOND);
        assert!(
            got.abs_diff(expected) * 100 <= expected,
            "weight {w}: {got} vs {expected}"
        );
        assert_eq!(run.sched.allocation(*id), 10_000_000 * w / 8);
    }
}

#[test]
fn thousand_equal_members_jain_at_least_0_99() {
    let mut sched = CarrierScheduler::new(100_000_000, 1250);
    let ids: Vec<MemberId> = (0..1000)
        .map(|_| sched.add_member(rates(0, 100_000_000, 1)))
        .collect();
    let mut run = Run::new(sched);
    run.until(10 * SECOND, |_| Some(1250));
    let goodput: Vec<f64> = ids
        .iter()
        .map(|id| run.bytes(*id, Duration::ZERO, 10 * SECOND) as f64)
        .collect();
    let sum: f64 = goodput.iter().sum();
    let squares: f64 = goodput.iter().map(|x| x * x).sum();
    let jain = sum * sum / (goodput.len() as f64 * squares);
    assert!(jain >= 0.99, "{jain}");
    assert_eq!(sum as u64, 100_000_000 * 10 / 8);
    assert_eq!(run.sched.allocation(ids[0]), 100_000);
}

#[test]
fn idle_members_share_goes_to_the_others() {
    let mut sched = CarrierScheduler::new(12_000_000, 1500);
    let ids: Vec<MemberId> = (0..3)
        .map(|_| sched.add_member(rates(0, 12_000_000, 1)))
        .collect();
    let (a, b, c) = (ids[0], ids[1], ids[2]);
    let mut run = Run::new(sched);
    // C has nothing for 5 s: A and B split the carrier.
    run.until(5 * SECOND, |m| (m != c).then_some(1500));
    assert_eq!(run.bytes(a, Duration::ZERO, 5 * SECOND), 6_000_000 * 5 / 8);
    assert_eq!(run.bytes(b, Duration::ZERO, 5 * SECOND), 6_000_000 * 5 / 8);
    assert_eq!(run.sched.allocation(a), 6_000_000);
    // C joins: thirds (5000 datagrams in 5 s, so one gets a datagram more).
    run.sched.wake(c);
    run.until(10 * SECOND, |_| Some(1500));
    for id in [a, b, c] {
        let got = run.bytes(id, 5 * SECOND, 10 * SECOND);
        assert!(got.abs_diff(4_000_000 * 5 / 8) <= 1500, "{got}");
        assert_eq!(run.sched.allocation(id), 4_000_000);
    }
    // B and C stop: within the activity window and one refresh A may use it all.
    run.until(10 * SECOND + ACTIVITY_WINDOW + ALLOCATION_REFRESH, |m| {
        (m == a).then_some(1500)
    });
    assert_eq!(run.sched.allocation(a), 12_000_000);
    let from = 10 * SECOND;
    let to = from + ACTIVITY_WINDOW + ALLOCATION_REFRESH;
    assert_eq!(run.bytes(a, from, to), 12_000_000 / 8 * 3 / 10);
}

#[test]
fn set_rates_takes_effect() {
    let mut sched = CarrierScheduler::new(10_000_000, 1250);
    let a = sched.add_member(rates(0, 2_000_000, 1));
    let b = sched.add_member(rates(0, 10_000_000, 1));
    let mut run = Run::new(sched);
    // MIR: A alone at 2 Mb/s, then at 6.
    run.until(5 * SECOND, |m| (m == a).then_some(1250));
    assert_eq!(run.bytes(a, Duration::ZERO, 5 * SECOND), 2_000_000 * 5 / 8);
    assert!(run.sched.set_rates(a, rates(0, 6_000_000, 1)));
    assert_eq!(run.sched.allocation(a), 6_000_000);
    run.until(10 * SECOND, |m| (m == a).then_some(1250));
    let got = run.bytes(a, 5 * SECOND, 10 * SECOND);
    assert!(got.abs_diff(6_000_000 * 5 / 8) <= 1250, "{got}");
    // Weight: with B backlogged too, 3:1.
    run.sched.set_rates(a, rates(0, 10_000_000, 3));
    run.sched.wake(b);
    run.until(20 * SECOND, |_| Some(1250));
    // The carrier, underused until 10 s, may catch up by two datagrams (the pacer's
    // allowance), and A's turn may straddle the change.
    let (got_a, got_b) = (
        run.bytes(a, 10 * SECOND, 20 * SECOND),
        run.bytes(b, 10 * SECOND, 20 * SECOND),
    );
    let total = got_a + got_b;
    assert!((10_000_000 * 10 / 8..=10_000_000 * 10 / 8 + 2 * 1250).contains(&total));
    assert!(got_a.abs_diff(7_500_000 * 10 / 8) <= 2 * 1250, "{got_a}");
    // CIR: B's 6 Mb/s first, the other 4 split 3:1.
    run.sched.set_rates(b, rates(6_000_000, 10_000_000, 1));
    assert_eq!(run.sched.allocation(a), 3_000_000);
    assert_eq!(run.sched.allocation(b), 7_000_000);
    run.until(30 * SECOND, |_| Some(1250));
    let got_b = run.bytes(b, 20 * SECOND, 30 * SECOND);
    assert!(got_b.abs_diff(7_000_000 * 10 / 8) <= 2 * 1250, "{got_b}");
}

#[test]
fn removal_mid_run() {
    let mut sched = CarrierScheduler::new(10_000_000, 1250);
    let a = sched.add_member(rates(0, 10_000_000, 1));
    let b = sched.add_member(rates(2_000_000, 10_000_000, 1));
    let mut run = Run::new(sched);
    run.until(5 * SECOND, |_| Some(1250));
    assert_eq!(run.bytes(b, Duration::ZERO, 5 * SECOND), 6_000_000 * 5 / 8);
    assert!(run.sched.remove(b));
    assert!(!run.sched.remove(b));
    assert!(!run.sched.set_rates(b, rates(0, 1, 1)));
    assert_eq!(run.sched.allocation(b), 0);
    assert_eq!(run.sched.allocation(a), 10_000_000);
    run.sched.wake(b);
    run.until(10 * SECOND, |m| {
        assert_ne!(m, b, "asked about a removed member");
        Some(1250)
    });
    assert_eq!(run.bytes(a, 5 * SECOND, 10 * SECOND), 10_000_000 * 5 / 8);
    // Its slot serves a new member under a new id.
    let c = run.sched.add_member(rates(0, 10_000_000, 1));
    assert_ne!(c, b);
    assert_eq!(run.sched.allocation(c), 5_000_000);
}

#[test]
fn datagram_larger_than_deficit_waits_its_turn() {
    // Quantum 1500 bytes each. A's 1000-byte datagrams fit once in its first turn and twice
    // in its second; B sends five of 300 per turn: equal bytes, neither starved.
    let mut sched = CarrierScheduler::new(1_000_000_000, 1500);
    let a = sched.add_member(rates(0, 1_000_000_000, 1));
    let b = sched.add_member(rates(0, 1_000_000_000, 1));
    let mut run = Run::new(sched);
    let size = |m: MemberId| Some(if m == a { 1000 } else { 300 });
    run.until(SECOND, size);
    let mut expected = vec![a];
    expected.extend([b; 5]);
    expected.extend([a; 2]);
    expected.extend([b; 5]);
    expected.push(a);
    assert_eq!(run.order(expected.len()), expected);
    let (bytes_a, bytes_b) = (
        run.bytes(a, Duration::ZERO, SECOND),
        run.bytes(b, Duration::ZERO, SECOND),
    );
    assert!(bytes_a.abs_diff(bytes_b) <= 1500, "{bytes_a} {bytes_b}");

    // A datagram larger than a quantum waits a turn and has its credit saved up.
    let mut sched = CarrierScheduler::new(1_000_000_000, 1500);
    let a = sched.add_member(rates(0, 1_000_000_000, 1));
    let b = sched.add_member(rates(0, 1_000_000_000, 1));
    let mut run = Run::new(sched);
    run.until(SECOND, |m| Some(if m == a { 2000 } else { 300 }));
    let mut expected = vec![b; 5];
    expected.push(a);
    expected.extend([b; 5]);
    expected.push(a);
    assert_eq!(run.order(expected.len()), expected);
    let (bytes_a, bytes_b) = (
        run.bytes(a, Duration::ZERO, SECOND),
        run.bytes(b, Duration::ZERO, SECOND),
    );
    assert!(bytes_a.abs_diff(bytes_b) <= 2000, "{bytes_a} {bytes_b}");
}

/// Lengths of the runs of consecutive sends to one member, with that member, in order.
fn turns_of(run: &Run) -> Vec<(MemberId, usize)> {
    let mut out: Vec<(MemberId, usize)> = Vec::new();
    for &(_, m, _) in &run.sends {
        match out.last_mut() {
            Some((last, n)) if *last == m => *n += 1,
            _ => out.push((m, 1)),
        }
    }
    out
}

#[test]
fn longer_turns_hold_the_carriers_burst_shared_by_the_active_weights() {
    // 1 Gbit/s and a 2 ms burst: 250,000 bytes a round, 125,000 a member; turns are cut to
    // 16,000 bytes, sixteen 1000-byte datagrams back to back.
    let mut sched = CarrierScheduler::new(1_000_000_000, 1000)
        .with_burst(Duration::from_millis(2))
        .with_turns_up_to(16_000);
    let a = sched.add_member(rates(0, 1_000_000_000, 1));
    let b = sched.add_member(rates(0, 1_000_000_000, 1));
    let mut run = Run::new(sched);
    run.until(Duration::from_millis(100), |_| Some(1000));
    let turns = turns_of(&run);
    assert!(turns.len() >= 40, "{} turns", turns.len());
    for (k, &(m, n)) in turns.iter().enumerate() {
        assert_eq!(m, if k % 2 == 0 { a } else { b }, "turn {k}");
        if k + 1 < turns.len() {
            assert_eq!(n, 16, "turn {k}");
        }
    }

    // 100 Mbit/s: 25,000 bytes a burst over weights 1 and 3, 6,250 bytes a unit of weight.
    // A turn of 6,250 bytes sends six datagrams and saves 250 for the next; one of 18,750,
    // eighteen, and with the 750 saved, nineteen next. The bytes keep to the weights.
    let mut sched = CarrierScheduler::new(100_000_000, 1000)
        .with_burst(Duration::from_millis(2))
        .with_turns_up_to(64_000);
    let a = sched.add_member(rates(0, 1_000_000_000, 1));
    let b = sched.add_member(rates(0, 1_000_000_000, 3));
    let mut run = Run::new(sched);
    run.until(SECOND, |_| Some(1000));
    let turns = turns_of(&run);
    assert_eq!(&turns[..4], &[(a, 6), (b, 18), (a, 6), (b, 19)]);
    assert!(turns.iter().all(|&(m, n)| n <= if m == a { 7 } else { 19 }));
    let (bytes_a, bytes_b) = (
        run.bytes(a, Duration::ZERO, SECOND),
        run.bytes(b, Duration::ZERO, SECOND),
    );
    assert!(
        (3 * bytes_a).abs_diff(bytes_b) <= 3 * 7_000,
        "{bytes_a} {bytes_b}"
    );
}

#[test]
fn turns_stay_one_mtu_a_weight_unless_asked() {
    // Even with a burst that could hold many: one datagram a turn for equal weights.
    let mut sched = CarrierScheduler::new(1_000_000_000, 1000).with_burst(Duration::from_millis(2));
    sched.add_member(rates(0, 1_000_000_000, 1));
    sched.add_member(rates(0, 1_000_000_000, 1));
    let mut run = Run::new(sched);
    run.until(Duration::from_millis(10), |_| Some(1000));
    let turns = turns_of(&run);
    assert!(turns.len() > 100);
    assert!(turns.iter().all(|&(_, n)| n == 1), "{turns:?}");
}

#[test]
fn poll_timeout_says_when_the_next_send_may_happen() {
    let mut sched = CarrierScheduler::new(12_000_000, 1500);
    let t0 = Instant::now();
    assert_eq!(sched.poll_timeout(t0), None);
    let a = sched.add_member(rates(0, 1_200_000, 1));
    assert_eq!(sched.poll_timeout(t0), Some(t0));
    assert_eq!(sched.next(t0, |_| Some(1500)), Some(a));
    sched.on_sent(t0, a, 1500);
    // The carrier is busy for 1 ms.
    assert_eq!(sched.next(t0, |_| Some(1500)), None);
    assert_eq!(sched.poll_timeout(t0), Some(t0 + Duration::from_millis(1)));
    // Then A's MIR holds it for 10 ms from its first send.
    let t1 = t0 + Duration::from_millis(1);
    assert_eq!(sched.next(t1, |_| Some(1500)), None);
    let t10 = t0 + Duration::from_millis(10);
    assert_eq!(sched.poll_timeout(t1), Some(t10));
    assert_eq!(sched.next(t10, |_| Some(1500)), Some(a));
    // Nothing to send: nothing to wait for until woken.
    assert_eq!(sched.next(t10, |_| None), None);
    assert_eq!(sched.poll_timeout(t10), None);
    sched.wake(a);
    assert_eq!(sched.poll_timeout(t10), Some(t10));
}

#[test]
fn ten_thousand_members_cost_o1_per_decision() {
    // Half of them with data, every one with a CIR (the queue by due time at work): `ready`
    // is asked about each idle member once, then about one or two members per datagram.
    let mut sched = CarrierScheduler::new(1_000_000_000, 1500);
    let ids: Vec<MemberId> = (0..10_000)
        .map(|_| sched.add_member(rates(10_000, 1_000_000_000, 1)))
        .collect();
    let busy = |m: MemberId| ids.iter().position(|x| *x == m).is_some_and(|i| i % 2 == 0);
    let busy: std::collections::HashSet<MemberId> =
        ids.iter().copied().filter(|m| busy(*m)).collect();
    let mut asked = 0u64;
    let mut run = Run::new(sched);
    run.until(SECOND, |m| {
        asked += 1;
        busy.contains(&m).then_some(1500)
    });
    let sent = run.sends.len() as u64;
    assert_eq!(sent, 1_000_000_000 / 8 / 1500 + 1);
    // Run asks once more per datagram to learn its size.
    assert!(asked <= 3 * sent + 5_000, "{asked} for {sent}");
    assert_eq!(run.sched.allocation(ids[0]), 200_000);
}

#[derive(Debug, Clone)]
enum Op {
    Add { cir: u64, mir: u64, weight: u32 },
    Remove(usize),
    Data(usize, Option<usize>),
    Run(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u64..3_000_000, 1u64..20_000_000, 0u32..6).prop_map(|(cir, mir, weight)| Op::Add {
            cir,
            mir,
            weight
        }),
        (0usize..16).prop_map(Op::Remove),
        (0usize..16, proptest::option::of(1usize..=1500)).prop_map(|(i, s)| Op::Data(i, s)),
        (1u64..400).prop_map(Op::Run),
    ]
}

/// Whether the sends `(ns, bytes)` ever exceed `rate_bps` over a window from one send to a
/// later one, beyond the pacer's catch-up `slack_bytes`, the datagram that opens the window
/// and 1 ns of rounding per datagram. In O(n): with `S` the bits sent so far (× 1e9), the
/// window from send i to send j holds `S_j − S_(i−1)`, and the excess splits into a term of j
/// and one of i, so a running minimum of the latter suffices.
fn exceeds(sends: &[(u64, u64)], rate_bps: u64, slack_bytes: u64) -> bool {
    let rate = i128::from(rate_bps);
    let allowance = i128::from(slack_bytes + 1500) * 8_000_000_000;
    let mut bits_before = 0i128;
    let mut least_start = i128::MAX;
    for (k, &(t, bytes)) in sends.iter().enumerate() {
        let (t, k) = (i128::from(t), k as i128);
        least_start = least_start.min(bits_before - rate * t - rate * (k - 1));
        bits_before += i128::from(bytes) * 8_000_000_000;
        if bits_before - rate * t - rate * k - least_start > allowance {
            return true;
        }
    }
    false
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn random_members_never_exceed_carrier_or_mir(ops in proptest::collection::vec(op(), 1..60)) {
        let carrier = 20_000_000;
        let mut sched = CarrierScheduler::new(carrier, 1500);
        let t0 = Instant::now();
        let mut now = t0;
        let mut members: Vec<(MemberId, MemberRates, Option<usize>)> = Vec::new();
        let mut removed: Vec<MemberId> = Vec::new();
        let mut sends: Vec<(u64, MemberId, u64)> = Vec::new();
        for op in ops {
            match op {
                Op::Add { cir, mir, weight } => {
                    let r = rates(cir, mir, weight);
                    members.push((sched.add_member(r), r, Some(1500)));
                }
                Op::Remove(i) if !members.is_empty() => {
                    let (id, _, _) = members.remove(i % members.len());
                    prop_assert!(sched.remove(id));
                    removed.push(id);
                }
                Op::Remove(_) => {}
                Op::Data(i, size) if !members.is_empty() => {
                    let i = i % members.len();
                    members[i].2 = size;
                    if size.is_some() {
                        sched.wake(members[i].0);
                    }
                }
                Op::Data(..) => {}
                Op::Run(ms) => {
                    let end = now + Duration::from_millis(ms);
                    let size_of = |m: MemberId| {
                        assert!(!removed.contains(&m));
                        members.iter().find(|x| x.0 == m).and_then(|x| x.2)
                    };
                    while now < end {
                        if let Some(m) = sched.next(now, size_of) {
                            let bytes = size_of(m);
                            prop_assert!(bytes.is_some());
                            let bytes = bytes.unwrap_or(0);
                            sched.on_sent(now, m, bytes);
                            sends.push(((now - t0).as_nanos() as u64, m, bytes as u64));
                            continue;
                        }
                        match sched.poll_timeout(now) {
                            Some(t) => {
                                prop_assert!(t > now);
                                now = t;
                            }
                            None => now = end,
                        }
                    }
                }
            }
            for (id, r, _) in &members {
                let a = sched.allocation(*id);
                prop_assert!(a <= r.mir_bps.max(r.cir_bps));
                prop_assert!(a >= r.cir_bps.min(r.mir_bps.max(r.cir_bps)));
            }
        }
        let all: Vec<(u64, u64)> = sends.iter().map(|(t, _, b)| (*t, *b)).collect();
        prop_assert!(!exceeds(&all, carrier, 2 * 1500));
        for (id, r, _) in &members {
            let mine: Vec<(u64, u64)> =
                sends.iter().filter(|s| s.1 == *id).map(|(t, _, b)| (*t, *b)).collect();
            prop_assert!(!exceeds(&mine, r.mir_bps.max(r.cir_bps), 2 * 1500), "{r:?}");
        }
    }
}

#[test]
fn a_member_sending_little_leaves_the_rest_to_a_busy_one() {
    let mut sched = CarrierScheduler::new(20_000_000, 1500);
    let a = sched.add_member(rates(0, 20_000_000, 1));
    let b = sched.add_member(rates(0, 20_000_000, 1));
    let mut run = Run::new(sched);
    let ms = Duration::from_millis;
    // A always has data; B has 1000 bytes every 200 ms (a request's answer), then nothing.
    for k in 0..10 {
        run.sched.wake(b);
        run.until(ms(200 * k + 1), |m| Some(if m == a { 1500 } else { 1000 }));
        run.until(ms(200 * (k + 1)), |m| (m == a).then_some(1500));
    }
    assert_eq!(run.bytes(b, Duration::ZERO, ms(2000)), 10 * 1000);
    // B counts at a datagram per refresh period (it sent 1000 bytes in one period of two),
    // not at half the carrier. Its own ceiling is the level A gets: when it has more data,
    // the round robin shares the carrier until its demand is measured.
    assert_eq!(run.sched.allocation(a), 20_000_000 - 120_000);
    assert_eq!(run.sched.allocation(b), 20_000_000 - 120_000);
    // Both busy: halves again once B's demand is measured.
    run.sched.wake(b);
    run.until(ms(2300), |_| Some(1500));
    assert_eq!(run.sched.allocation(a), 10_000_000);
    assert_eq!(run.sched.allocation(b), 10_000_000);
}

#[test]
fn the_counted_members_make_the_allocations_as_shares_between_them() {
    let mut sched = CarrierScheduler::new(20_000_000, 1500);
    let a = sched.add_member(rates(0, 20_000_000, 1));
    let b = sched.add_member(rates(0, 20_000_000, 1));
    let mut run = Run::new(sched);
    let ms = Duration::from_millis;
    // As above: A always has data, B 1000 bytes every 200 ms.
    for k in 0..10 {
        run.sched.wake(b);
        run.until(ms(200 * k + 1), |m| Some(if m == a { 1500 } else { 1000 }));
        run.until(ms(200 * (k + 1)), |m| (m == a).then_some(1500));
    }
    run.sched.wake(b);
    run.until(ms(2001), |m| Some(if m == a { 1500 } else { 1000 }));
    run.until(ms(2050), |m| (m == a).then_some(1500));
    let now = run.now;
    let mut counted = Vec::new();
    run.sched.counted(now, &mut counted);
    let [ca, cb] = counted[..] else {
        panic!("{counted:?}");
    };
    assert_eq!((ca.id, cb.id), (a, b));
    // A has data: it counts for a window from now, at its MIR (it sent at its share).
    assert_eq!(ca.until, now + ACTIVITY_WINDOW);
    assert_eq!(ca.rates, rates(0, 20_000_000, 1));
    // B counts at twice the 1000 bytes it sent in its last period, or at a datagram a
    // period after one it sent nothing in, until a window after its last.
    assert!([120_000, 160_000].contains(&cb.rates.mir_bps), "{cb:?}");
    assert!(cb.until > now && cb.until < now + ACTIVITY_WINDOW);
    let mut of = vec![ca.rates, cb.rates];
    let shares = Shares::of(20_000_000, &mut of);
    for id in [a, b] {
        let own = shares.allocation(&rates(0, 20_000_000, 1));
        assert_eq!(own, run.sched.allocation(id));
    }
    assert_eq!(shares.allocation(&cb.rates), cb.rates.mir_bps);
    // Past B's window only A counts.
    run.until(cb.until - run.t0 + ms(1), |m| (m == a).then_some(1500));
    run.sched.counted(run.now, &mut counted);
    assert_eq!(counted.iter().map(|c| c.id).collect::<Vec<_>>(), [a]);
}
