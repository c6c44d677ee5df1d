use super::*;

const M: u64 = 1_000_000;

fn spec(weight: u32) -> PeerSpec {
    PeerSpec {
        name: format!("w{weight}"),
        public_key: None,
        address: None,
        subnets: Vec::new(),
        tx_bps: 100 * M,
        rx_bps: 100 * M,
        min_bps: 0,
        weight,
        keepalive: Duration::from_secs(5),
        max_flows: 100,
    }
}

/// Worker `w`'s peer `w` stages a 1000-byte datagram every 100 µs (80 Mbit/s) from
/// `from`, `count` of them, each sent as it may.
fn busy(s: &mut CarrierShare, w: u32, from: Instant, count: u32) {
    let to = SocketAddr::from(([198, 18, 0, 2], 7400));
    for k in 0..count {
        let at = from + Duration::from_micros(100) * k;
        s.stage(at, PeerId(w), to, vec![0; 1000]);
        s.next(at);
    }
}

/// Worker `w`'s share of a 100 Mbit/s carrier, with peer `w` of `weight`.
fn worker(carrier: &Arc<SharedCarrier>, w: u32, weight: u32) -> CarrierShare {
    worker_with(carrier, w, spec(weight))
}

fn worker_with(carrier: &Arc<SharedCarrier>, w: u32, spec: PeerSpec) -> CarrierShare {
    let mut s = CarrierShare::new(100 * M, 1500, Duration::from_millis(1))
        .on_worker(carrier.clone(), w as usize);
    s.add(PeerId(w), &spec, 0);
    s
}

/// The peers whose datagrams leave at `now`, each restaging as soon as it sent (as the
/// driver's pass does), until the carrier holds the next back.
fn released_at(s: &mut CarrierShare, now: Instant, peers: &[u32]) -> Vec<u32> {
    let to = SocketAddr::from(([198, 18, 0, 2], 7400));
    let mut out = Vec::new();
    loop {
        for &p in peers {
            if !s.is_staged(PeerId(p)) {
                s.stage(now, PeerId(p), to, vec![0; 1000]);
            }
        }
        match s.next(now) {
            Some((peer, _, _)) => out.push(peer.0),
            None => return out,
        }
    }
}

#[test]
fn a_peer_s_turn_is_a_run_of_datagrams_that_may_leave_in_one_send() {
    // 1 Gbit/s, a 2 ms burst, two busy peers of weight 1: a turn would be 125,000 bytes
    // and is cut to one send's 65,507, so 65 datagrams of 1000 bytes.
    let mut s = CarrierShare::new(1_000 * M, 1000, Duration::from_millis(2));
    let fast = PeerSpec {
        tx_bps: 1_000 * M,
        ..spec(1)
    };
    s.add(PeerId(1), &fast, 0);
    s.add(PeerId(2), &fast, 0);
    let t0 = Instant::now();
    assert_eq!(released_at(&mut s, t0, &[1, 2]), [1]);
    // Each millisecond after, the carrier owes 125 datagrams, released at one instant
    // as turns of 65 or 66 (the 507 bytes a turn leaves over add up) to one peer; a turn
    // the carrier cuts goes on at the next instant. Peer 2 had not sent before, so its
    // own schedule lets one datagram go at the first instant (its MIR has nothing to
    // catch up), and peer 1 starts its next turn.
    let mut turns: Vec<(u32, usize)> = Vec::new();
    let mut sent = [0usize; 2];
    for ms in 1..=20 {
        let released = released_at(&mut s, t0 + Duration::from_millis(ms), &[1, 2]);
        assert!(
            (124..=127).contains(&released.len()),
            "{ms} ms: {released:?}"
        );
        for p in released {
            sent[p as usize - 1] += 1;
            match turns.last_mut() {
                Some((q, n)) if *q == p => *n += 1,
                _ => turns.push((p, 1)),
            }
        }
    }
    assert_eq!(turns[..3], [(1, 64), (2, 1), (1, 66)]);
    let whole = &turns[3..turns.len() - 1];
    assert!(
        whole.iter().all(|&(_, n)| (65..=66).contains(&n)),
        "{turns:?}"
    );
    assert!(whole.windows(2).all(|w| w[0].0 != w[1].0));
    // The turns alternate: the peers part apart by peer 2's short first turn and where
    // the last one was cut, at most two turns.
    assert!(sent[0].abs_diff(sent[1]) <= 2 * 66, "{sent:?} {turns:?}");
}

#[test]
fn a_worker_the_split_leaves_nothing_still_sends_a_datagram_a_refresh() {
    let to = SocketAddr::from(([198, 18, 0, 2], 7400));
    let carrier = SharedCarrier::new(100 * M, 1500, Duration::from_millis(1), 2);
    // Worker 1's peer has all of the carrier as its min_rate.
    let committed = PeerSpec {
        min_bps: 100 * M,
        ..spec(1)
    };
    let (mut a, mut b) = (worker(&carrier, 0, 1), worker_with(&carrier, 1, committed));
    let t = Instant::now();
    busy(&mut b, 1, t, 100);
    let now = t + Duration::from_millis(10);
    b.set_carrier(now, 100 * M);
    a.stage(now, PeerId(0), to, vec![0; 1500]);
    // One 1500-byte datagram a 100 ms refresh, not none.
    assert_eq!(a.sched.carrier_bps(), 120_000);
    let mut at = now;
    for _ in 0..2 {
        at = a.poll_timeout(at).expect("staged").max(at);
        assert!(at <= now + REFRESH, "{:?}", at - now);
        assert!(a.next(at).is_some());
        a.stage(at, PeerId(0), to, vec![0; 1500]);
    }
    assert!(a.poll_timeout(at).expect("staged") <= now + 2 * REFRESH);
}

#[test]
fn busy_peers_on_two_workers_split_by_weight_and_keepalives_take_nothing() {
    // 1 : 3, then the second sends a 1000-byte datagram a second.
    let terminals = [
        terminal(0, 1, 0, 100 * M, BUSY),
        terminal(1, 3, 0, 100 * M, BUSY),
    ];
    on_any_workers(
        100 * M,
        &terminals,
        Duration::from_millis(1500),
        &[(1, Some(8_000))],
    );
}

/// A terminal of a simulated hub: where it is served, its rates, and what its clients
/// offer.
#[derive(Clone, Debug)]
struct Terminal {
    worker: usize,
    weight: u32,
    cir: u64,
    mir: u64,
    /// In bit/s; `None`: as much as it may (a bulk download).
    offered: Option<u64>,
}

const BUSY: Option<u64> = None;
const IDLE: Option<u64> = Some(0);

fn terminal(worker: usize, weight: u32, cir: u64, mir: u64, offered: Option<u64>) -> Terminal {
    Terminal {
        worker,
        weight,
        cir,
        mir,
        offered,
    }
}

/// A hub's carrier on a simulated clock, as the tunnel and the driver use it: a share per
/// worker (one plain share for one worker), each peer's ceiling refreshed when due, and
/// each terminal's association a source of 1000-byte datagrams paced at the lesser of
/// its ceiling and what its clients offer, one staged at a time, the next made as the
/// last leaves.
struct Hub {
    carrier_bps: u64,
    shares: Vec<CarrierShare>,
    terminals: Vec<Terminal>,
    sources: Vec<Pacer>,
    ceilings: Vec<u64>,
    sent: Vec<u64>,
    now: Instant,
    steps: usize,
    /// The worker that sent last.
    turn: usize,
}

impl Hub {
    fn new(carrier_bps: u64, workers: usize, terminals: &[Terminal]) -> Hub {
        let burst = Duration::from_millis(1);
        let carrier = SharedCarrier::new(carrier_bps, 1500, burst, workers);
        let mut shares: Vec<CarrierShare> = (0..workers)
            .map(|w| {
                let s = CarrierShare::new(carrier_bps, 1500, burst);
                if workers > 1 {
                    s.on_worker(carrier.clone(), w)
                } else {
                    s
                }
            })
            .collect();
        let terminals: Vec<Terminal> = terminals
            .iter()
            .map(|t| Terminal {
                worker: t.worker % workers,
                ..t.clone()
            })
            .collect();
        for (i, t) in terminals.iter().enumerate() {
            let spec = PeerSpec {
                min_bps: t.cir,
                tx_bps: t.mir,
                ..spec(t.weight)
            };
            shares[t.worker].add(PeerId(i as u32), &spec, 0);
        }
        Hub {
            carrier_bps,
            shares,
            sources: terminals
                .iter()
                .map(|t| Pacer::new(t.mir, 1000).with_burst(burst))
                .collect(),
            ceilings: terminals.iter().map(|t| t.mir).collect(),
            sent: vec![0; terminals.len()],
            terminals,
            now: Instant::now(),
            steps: 0,
            turn: 0,
        }
    }

    fn set_offered(&mut self, i: usize, offered: Option<u64>) {
        self.terminals[i].offered = offered;
        self.pace(i);
    }

    fn pace(&mut self, i: usize) {
        let (ceiling, offered) = (self.ceilings[i], self.terminals[i].offered);
        self.sources[i].set_rate(offered.map_or(ceiling, |o| o.min(ceiling)).max(1));
    }

    /// Terminal `i`'s next datagram, if its clients offer one and its pacing lets it go.
    fn produce(&mut self, i: usize) {
        let now = self.now;
        let t = &self.terminals[i];
        let share = &mut self.shares[t.worker];
        if t.offered == IDLE
            || share.is_staged(PeerId(i as u32))
            || self.sources[i].delay_until(now).is_some()
        {
            return;
        }
        self.sources[i].on_sent(now, 1000);
        let to = SocketAddr::from(([198, 18, 0, 2], 7400));
        share.stage(now, PeerId(i as u32), to, vec![0; 1000]);
    }

    /// `d` of 100 µs steps; the workers take turns a datagram each at the shared pacer.
    fn run(&mut self, d: Duration) {
        let step = Duration::from_micros(100);
        let end = self.now + d;
        while self.now < end {
            let now = self.now;
            for w in 0..self.shares.len() {
                if !self.shares[w].refresh_due(now) {
                    continue;
                }
                self.shares[w].set_carrier(now, self.carrier_bps);
                for i in 0..self.terminals.len() {
                    if self.terminals[i].worker == w {
                        let mir = self.terminals[i].mir;
                        self.ceilings[i] = self.shares[w].ceiling(PeerId(i as u32), mir);
                        self.pace(i);
                    }
                }
                self.shares[w].refreshed(now);
            }
            for i in 0..self.terminals.len() {
                self.produce(i);
            }
            // Round robin from the worker after the last that sent.
            let workers = self.shares.len();
            let mut idle = 0;
            while idle < workers {
                self.turn = (self.turn + 1) % workers;
                match self.shares[self.turn].next(now) {
                    Some((peer, _, buf)) => {
                        self.sent[peer.0 as usize] += buf.len() as u64;
                        self.produce(peer.0 as usize);
                        idle = 0;
                    }
                    None => idle += 1,
                }
            }
            self.now += step;
            self.steps += 1;
        }
    }

    /// Each terminal's rate over `d` of running, in bit/s.
    fn rates(&mut self, d: Duration) -> Vec<u64> {
        self.sent.iter_mut().for_each(|s| *s = 0);
        self.run(d);
        let ms = d.as_millis() as u64;
        self.sent.iter().map(|&b| b * 8 * 1000 / ms).collect()
    }
}

/// What the scheduler's water-filling over all `terminals` on one carrier gives each:
/// every active one counts at its MIR or, when its clients offer less, at twice that
/// (at least a 1500-byte datagram per 100 ms period, never below its CIR); one whose
/// clients offer less than its share sends what they offer.
fn water_filling(carrier_bps: u64, terminals: &[Terminal]) -> Vec<u64> {
    let counted: Vec<MemberRates> = terminals
        .iter()
        .map(|t| MemberRates {
            cir_bps: t.cir,
            mir_bps: match t.offered {
                None => t.mir,
                Some(o) => t.mir.min((2 * o).max(120_000)).max(t.cir),
            },
            weight: t.weight,
        })
        .collect();
    let active: Vec<MemberRates> = counted
        .iter()
        .zip(terminals)
        .filter(|(_, t)| t.offered != IDLE)
        .map(|(c, _)| *c)
        .collect();
    let mut shares = pep_transport::allocations(carrier_bps, &active).into_iter();
    terminals
        .iter()
        .map(|t| match t.offered {
            IDLE => 0,
            None => shares.next().unwrap_or(0),
            Some(o) => o.min(shares.next().unwrap_or(0)),
        })
        .collect()
}

/// Each terminal's rate within 2 % of `expected`, or of one datagram a second (a light
/// one's datagrams fall into a second of measuring one more or less).
fn assert_within_2_percent(what: &str, rates: &[u64], expected: &[u64]) {
    for (i, (&r, &e)) in rates.iter().zip(expected).enumerate() {
        assert!(
            r.abs_diff(e) <= (e / 50).max(8_000),
            "{what}: terminal {i} at {r} bit/s, expected {e}\n{rates:?}\n{expected:?}"
        );
    }
}

/// The hub on 1, 2, 4 and 8 workers (terminal `i` on its worker modulo the workers): over
/// a second after `warmup`, every terminal's rate within 2 % of the water-filling and of
/// what it gets on one worker; then `change` (terminal, offered) and the same again.
fn on_any_workers(
    carrier_bps: u64,
    terminals: &[Terminal],
    warmup: Duration,
    change: &[(usize, Option<u64>)],
) {
    let second = Duration::from_secs(1);
    let mut changed = terminals.to_vec();
    for &(i, offered) in change {
        changed[i].offered = offered;
    }
    let expected = [
        water_filling(carrier_bps, terminals),
        water_filling(carrier_bps, &changed),
    ];
    let mut single: Vec<Vec<u64>> = Vec::new();
    for workers in [1, 2, 4, 8] {
        let mut hub = Hub::new(carrier_bps, workers, terminals);
        hub.run(warmup);
        let mut rates = vec![hub.rates(second)];
        for &(i, offered) in change {
            hub.set_offered(i, offered);
        }
        hub.run(warmup);
        rates.push(hub.rates(second));
        for (phase, r) in rates.iter().enumerate() {
            let what = format!("{workers} workers, phase {phase}");
            assert_within_2_percent(&what, r, &expected[phase]);
            if let Some(one) = single.get(phase) {
                assert_within_2_percent(&format!("{what} against one"), r, one);
            }
        }
        if workers == 1 {
            single = rates;
        }
    }
}

#[test]
fn the_testbed_hub_s_downloads_get_their_weights_shares_on_any_number_of_workers() {
    // As `pep-testbed hub --terminals 8 --download 1,4,6 --requests 2`: a 20 Mbit/s
    // carrier, terminals 1, 4 and 6 downloading (0, 3 and 5 here), 2 a 1000-byte
    // response every 200 ms, the others idle; weights all 1, then 4's 2.
    for weight in [1, 2] {
        let mut terminals = vec![terminal(0, 1, 0, 20 * M, IDLE); 8];
        for (i, t) in terminals.iter_mut().enumerate() {
            t.worker = i;
        }
        terminals[1].offered = Some(40_000);
        for i in [0, 3, 5] {
            terminals[i].offered = BUSY;
        }
        terminals[3].weight = weight;
        // Then 4 stops and 7 downloads.
        on_any_workers(
            20 * M,
            &terminals,
            Duration::from_millis(1500),
            &[(3, IDLE), (6, BUSY)],
        );
    }
}

#[test]
fn twenty_four_terminals_on_eight_workers_get_what_one_scheduler_gives_each() {
    // Unevenly: a busy one alone on worker 0, three busy on 1, light and busy ones with
    // CIRs and MIRs, idle ones alone on 3, weights 1 and 2; 100 Mbit/s.
    let terminals = [
        terminal(0, 1, 0, 100 * M, BUSY),
        terminal(1, 2, 0, 100 * M, BUSY),
        terminal(1, 1, 0, 100 * M, BUSY),
        terminal(1, 1, 10 * M, 100 * M, BUSY),
        terminal(2, 2, 0, 100 * M, Some(M)),
        terminal(2, 1, 0, 100 * M, Some(2 * M)),
        terminal(2, 1, 0, 100 * M, IDLE),
        terminal(2, 2, 5 * M, 100 * M, BUSY),
        terminal(3, 1, 0, 100 * M, IDLE),
        terminal(3, 2, 0, 100 * M, IDLE),
        terminal(3, 1, 2 * M, 100 * M, IDLE),
        terminal(3, 1, 0, 100 * M, IDLE),
        terminal(4, 1, 0, 100 * M, Some(M / 2)),
        terminal(4, 1, 0, 4 * M, BUSY),
        terminal(4, 1, 0, 100 * M, BUSY),
        terminal(5, 1, 2 * M, 100 * M, Some(2 * M)),
        terminal(5, 2, 0, 100 * M, IDLE),
        terminal(5, 2, 0, 100 * M, Some(3 * M / 2)),
        terminal(6, 1, 0, 100 * M, BUSY),
        terminal(6, 2, 0, 100 * M, BUSY),
        terminal(6, 1, 0, 100 * M, Some(M / 5)),
        terminal(7, 1, 0, 100 * M, IDLE),
        terminal(7, 2, 0, 9 * M, BUSY),
        terminal(7, 1, 0, 100 * M, Some(M)),
    ];
    // Then the lone busy one stops, an idle one with a CIR downloads, a light one
    // downloads and a busy one of the three goes light.
    on_any_workers(
        100 * M,
        &terminals,
        Duration::from_millis(1500),
        &[(0, IDLE), (10, BUSY), (5, BUSY), (1, Some(M))],
    );
}
