use super::*;

fn class(weight: u32, priority: bool, max_rate_bps: Option<u64>) -> TrafficClass {
    TrafficClass {
        weight,
        priority,
        max_rate_bps,
    }
}

/// Serves `sched` for `turns` chunks of `chunk` bytes at `now`, each flow going back to the
/// end of its class's queue after every chunk (always having more), as the association does
/// after a flow's quantum; returns the classes served in order.
fn serve(sched: &mut FlowScheduler, now: Instant, turns: usize, chunk: usize) -> Vec<u8> {
    let mut order = Vec::new();
    for _ in 0..turns {
        let Some((class, flow)) = sched.pop_next(now) else {
            break;
        };
        sched.push_back(class, flow);
        sched.on_sent(class, now, chunk, true, None);
        order.push(class);
    }
    order
}

#[test]
fn without_classes_one_queue_in_order() {
    let mut s = FlowScheduler::new(&[], 1500, Duration::ZERO);
    assert!(!s.measures_delay());
    let now = Instant::now();
    for f in [4, 2, 6] {
        s.push_back(0, f);
    }
    // A class number nobody configured is class 0.
    s.push_back(9, 8);
    assert_eq!(s.len(), 4);
    let flows: Vec<FlowId> = std::iter::from_fn(|| s.pop_next(now).map(|(_, f)| f)).collect();
    assert_eq!(flows, [4, 2, 6, 8]);
    assert!(s.is_empty());
    assert_eq!(s.held_until(now), None);
}

#[test]
fn weighted_classes_take_turns_of_weight_times_the_quantum() {
    let classes = [class(1, false, None), class(3, false, None)];
    let mut s = FlowScheduler::new(&classes, 1500, Duration::ZERO);
    let now = Instant::now();
    s.push_back(0, 10);
    s.push_back(1, 20);
    // 1 KiB chunks: class 0 for 8, class 1 for 24, and so on.
    let order = serve(&mut s, now, 64, 1024);
    let mut runs: Vec<(u8, usize)> = Vec::new();
    for c in order {
        match runs.last_mut() {
            Some((last, n)) if *last == c => *n += 1,
            _ => runs.push((c, 1)),
        }
    }
    assert_eq!(runs, [(0, 8), (1, 24), (0, 8), (1, 24)]);
}

#[test]
fn priority_first_within_its_cap_then_the_others() {
    // 1 Mbit/s cap: a 1000-byte chunk books 8 ms of it.
    let classes = [class(1, false, None), class(1, true, Some(1_000_000))];
    let mut s = FlowScheduler::new(&classes, 1500, Duration::ZERO);
    let t0 = Instant::now();
    s.push_back(0, 10);
    s.push_back(1, 20);
    assert_eq!(serve(&mut s, t0, 1, 1000), [1]);
    // The cap's schedule: the next chunk may leave 8 ms after the first; class 0 goes on.
    assert!(s.ready(t0));
    assert_eq!(s.held_until(t0), Some(t0 + Duration::from_millis(8)));
    assert_eq!(serve(&mut s, t0, 3, 1000), [0, 0, 0]);
    let next = t0 + Duration::from_millis(8);
    assert_eq!(serve(&mut s, next, 2, 1000), [1, 0]);
    // Only the priority class has data: it waits for its cap.
    assert_eq!(s.pop_next(next).map(|(c, _)| c), Some(0));
    let mut only = FlowScheduler::new(&classes, 1500, Duration::ZERO);
    only.push_back(1, 20);
    assert_eq!(serve(&mut only, t0, 5, 1000), [1]);
    assert!(!only.ready(t0));
    assert_eq!(only.held_until(t0), Some(t0 + Duration::from_millis(8)));
    assert!(only.ready(t0 + Duration::from_millis(8)));
}

#[test]
fn a_flow_moves_with_its_class_and_counts_there() {
    let classes = [class(1, false, None), class(2, false, None)];
    let mut s = FlowScheduler::new(&classes, 1500, Duration::ZERO);
    s.count_flow(0, true);
    s.push_back(0, 7);
    assert!(s.remove(0, 7));
    assert!(!s.remove(0, 7));
    s.count_flow(0, false);
    s.count_flow(1, true);
    s.push_back(1, 7);
    assert_eq!(s.pop_next(Instant::now()), Some((1, 7)));
    let stats = s.stats([1u8, 1, 0].into_iter());
    assert_eq!(
        stats
            .iter()
            .map(|c| (c.flows_total, c.flows_open))
            .collect::<Vec<_>>(),
        [(0, 1), (1, 2)]
    );
}

#[test]
fn counters_of_first_sends_repairs_and_queue_delay() {
    let mut s = FlowScheduler::new(&[class(1, false, None)], 1500, Duration::ZERO);
    let now = Instant::now();
    s.on_sent(0, now, 1000, true, Some(Duration::from_millis(20)));
    s.on_sent(0, now, 500, true, None);
    s.on_sent(0, now, 300, false, None);
    let c = &s.stats(std::iter::empty())[0];
    assert_eq!((c.bytes_sent, c.bytes_retransmitted), (1500, 300));
    assert!((c.queue_delay_byte_seconds - 20.0).abs() < 1e-9);
}

#[test]
fn write_times_give_each_byte_its_write() {
    let t0 = Instant::now();
    let ms = |n| t0 + Duration::from_millis(n);
    let mut w = WriteTimes::default();
    w.written(100, ms(0));
    w.written(300, ms(5));
    w.written(350, ms(5));
    assert_eq!(w.sent_from(0), Some(ms(0)));
    assert_eq!(w.sent_from(99), Some(ms(0)));
    assert_eq!(w.sent_from(100), Some(ms(5)));
    assert_eq!(w.sent_from(349), Some(ms(5)));
    assert_eq!(w.sent_from(350), None);
}

#[test]
fn write_times_merge_the_closest_runs_under_the_older_time() {
    let t0 = Instant::now();
    let mut w = WriteTimes::default();
    // Runs 10 ms apart, but two of them 1 ms apart: those merge when the list is full.
    let mut at = t0;
    let mut end = 0;
    for i in 0..WRITE_TIMES_KEPT as u64 {
        at += Duration::from_millis(if i == 5 { 1 } else { 10 });
        end += 100;
        w.written(end, at);
    }
    w.written(end + 100, at + Duration::from_millis(10));
    assert_eq!(w.runs.len(), WRITE_TIMES_KEPT);
    // Runs 4 (bytes 400..500, at 50 ms) and 5 (500..600, at 51 ms) are one now, at 50 ms.
    assert_eq!(w.sent_from(550), Some(t0 + Duration::from_millis(50)));
    assert_eq!(w.sent_from(600), Some(t0 + Duration::from_millis(61)));
}
