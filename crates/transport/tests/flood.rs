//! Floods of hostile datagrams against a secure association during a bulk transfer: junk,
//! forged and replayed handshake initiations, junk replies. Its own test binary, so the
//! counting allocator sees only this test.

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use pep_transport::security::{public_key, stamp_initiation_macs};
use support::{
    bulk_with_progress, establish_within_20s as established, fin_at, geo_secure as geo, pattern,
    security_pair, Faults, Net, INIT, REPLY,
};

/// Live heap bytes of this test binary, to show hostile input does not grow memory.
struct CountingAlloc;
static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

const MS: Duration = Duration::from_millis(1);

#[test]
fn junk_and_handshake_floods_neither_grow_memory_nor_slow_the_transfer() {
    let bytes = 10_000_000;
    let mut quiet = geo(Faults::default(), 11, Duration::from_secs(120));
    established(&mut quiet);
    let t0 = quiet.elapsed();
    let (p, _) = bulk_with_progress(&mut quiet, bytes);
    let quiet_time = p.last().unwrap().0 - t0;

    let mut n = geo(Faults::default(), 11, Duration::from_secs(120));
    n.record_a = Some(Vec::new());
    established(&mut n);
    let captured_init = n
        .record_a
        .take()
        .unwrap()
        .into_iter()
        .find(|d| d[0] == INIT)
        .unwrap();
    let data = pattern(4, bytes);
    let f = n.open(0, 1002, data.clone(), true);
    let t0 = n.elapsed();
    let responder_key = public_key(&security_pair(Duration::ZERO)[1].local_private_key);
    let mut rng = 0x1234_5678_9abc_def1u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut flood = |n: &mut Net, count: usize| {
        for i in 0..count {
            let len = 1 + (next() % 1400) as usize;
            let mut d: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            match i % 4 {
                // Forged initiations (fresh random ephemerals, and the mac1 anyone who
                // knows the responder's public key can compute: each costs a DH unless
                // rate limited).
                0 => {
                    d.resize(150, 0);
                    d[0] = INIT;
                    d[1..5].copy_from_slice(&pep_transport::PROTOCOL_VERSION.to_be_bytes());
                    // No source connection ID.
                    d[5] = 0;
                    stamp_initiation_macs(&mut d, &responder_key, None);
                }
                // Replays of a genuine initiation.
                1 => d = captured_init.clone(),
                // Junk short packets and junk replies.
                2 => d[0] &= 0x7f,
                _ => d[0] = REPLY,
            }
            n.inject(1, &d);
        }
    };
    // 1,000 hostile datagrams every 10 ms of simulated time (100,000 per second).
    let mut rounds = 0;
    let end = n.now + Duration::from_secs(120);
    while n.now < end && !fin_at(&n, 1, f) {
        let stop = n.now + MS * 10;
        while n.now < stop {
            if !n.step() {
                panic!(
                    "stalled at {:?}: {:?} / {:?}\n{:?}\n{:?}",
                    n.elapsed(),
                    n.ends[0],
                    n.ends[1],
                    n.ends[0].stats(),
                    n.ends[1].stats()
                );
            }
        }
        flood(&mut n, 1000);
        rounds += 1;
    }
    assert!(fin_at(&n, 1, f));
    assert_eq!(n.apps[1].flows[&f].received, data);
    let flood_time = n.elapsed() - t0;
    // Memory: keep flooding the idle association, 100 datagrams per 10 ms; once the bounded
    // structures are full nothing more may be retained.
    let mut round = |n: &mut Net| {
        let stop = n.now + MS * 10;
        let mut spins = 0;
        let mut last = n.now;
        while n.now < stop && n.step() {
            if n.now == last {
                spins += 1;
                assert!(
                    spins < 10_000,
                    "time stands still at {:?}: timeouts {:?} {:?}, {:?} {:?}",
                    n.elapsed(),
                    n.ends[0]
                        .poll_timeout()
                        .map(|t| t.saturating_duration_since(n.now)),
                    n.ends[1]
                        .poll_timeout()
                        .map(|t| t.saturating_duration_since(n.now)),
                    n.ends[0].stats(),
                    n.ends[1].stats()
                );
            } else {
                spins = 0;
                last = n.now;
            }
        }
        flood(n, 100);
    };
    // The lowest live heap over `rounds` rounds. The pair's own traffic under the flood (it
    // goes through outages, probes and re-initiations about every 10 s) keeps up to 150 kB
    // of sent-packet records and decode buffers live at a time, so one instant's reading
    // says little: two instants 10 s apart differed by -36 kB to +120 kB with the same
    // code, depending on where in that cycle they fell. Each 10 s window holds a trough,
    // where what is live is what is retained.
    fn lowest_over(n: &mut Net, rounds: usize, round: &mut impl FnMut(&mut Net)) -> isize {
        (0..rounds)
            .map(|_| {
                round(n);
                LIVE.load(Ordering::Relaxed)
            })
            .min()
            .expect("at least one round")
    }
    // 90 s of it before the first window ends: enough for the rate-limited initiations to
    // fill the bounded memory of recent ones (20 per second, RECENT_INITIATIONS = 1024),
    // for the finished flow to be released and for the buffers to reach their sizes.
    for _ in 0..9000 {
        round(&mut n);
    }
    let before = lowest_over(&mut n, 1000, &mut round);
    for _ in 0..1000 {
        round(&mut n);
    }
    let after = lowest_over(&mut n, 1000, &mut round);
    // At least 100,000 hostile datagrams arrive between any moment of the first window and
    // any of the second, so retaining one byte of each lifts every reading of the second
    // window by 100 kB over the first window's trough.
    let growth = after - before;
    let d = n.ends[1].stats().security;
    eprintln!(
        "flood: {} rounds, transfer {flood_time:?} vs {quiet_time:?} quiet, heap growth {growth} B, drops {d:?}",
        rounds
    );
    assert!(rounds > 200);
    assert!(d.handshake_rate_limited > 0 && d.handshake_replayed > 0 && d.unauthenticated > 0);
    // Remembering even one byte of each of 100,000 more hostile datagrams would show.
    assert!(
        growth < 64 << 10,
        "heap grew {growth} bytes under the flood"
    );
    assert!(
        flood_time.as_secs_f64() <= quiet_time.as_secs_f64() * 1.05,
        "{flood_time:?} under flood vs {quiet_time:?}"
    );
}
