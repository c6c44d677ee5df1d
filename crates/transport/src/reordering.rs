//! How far the path reorders packets, measured in time, and which declared losses were not
//! losses at all. Loss detection asks it how long a packet may trail a later one before it
//! counts as lost: on a path that does not reorder, the classic rules (three later packets, or 9/8 of
//! the RTT); on one that does, a time window that covers the reordering seen (RACK, RFC 8985:
//! a packet is lost once a packet sent after it was acknowledged and the window has passed
//! since that one's RTT would have brought it). docs/PROTOCOL.md §5.3 gives the rules.

use std::collections::BTreeMap;
use std::ops::Range;
use std::time::{Duration, Instant};

/// Reordering is remembered over two alternating windows of this length: a path that stops
/// reordering goes back to the packet count within one to two of them.
const WINDOW: Duration = Duration::from_secs(30);
/// The loss window covers the latest reordering seen with this margin, so the next packet held
/// a little longer than any before it is not taken for lost at once.
const MARGIN_NUM: u32 = 5;
const MARGIN_DEN: u32 = 4;
/// Declared losses are watched for a late acknowledgement this long (or four smoothed RTTs):
/// a packet reordered by more than that is lost for every purpose.
const WATCH: Duration = Duration::from_secs(2);
const WATCH_RTTS: u32 = 4;
/// At most this many declared losses are watched; the oldest go first.
const WATCH_MAX: usize = 4096;

#[derive(Debug, Default)]
pub struct Reordering {
    /// The longest a packet trailed a later-sent one, in the current and the previous window.
    current: Duration,
    previous: Duration,
    current_seen: bool,
    previous_seen: bool,
    window_start: Option<Instant>,
    /// The latest send time among acknowledged packets (RACK.xmit_ts), and when it was
    /// acknowledged: the difference is RACK.rtt, taken only when asked for, as most
    /// acknowledged packets replace it before that.
    latest: Option<(Instant, Instant)>,
    /// Packets declared lost and still watched: number → (sent at, declared at, whether the
    /// loss may speak for reordering: not when an outage declared it).
    declared: BTreeMap<u64, (Instant, Instant, bool)>,
    spurious: u64,
}

impl Reordering {
    fn roll(&mut self, now: Instant) {
        match self.window_start {
            Some(start) if now.saturating_duration_since(start) < WINDOW => {}
            _ => {
                self.previous = self.current;
                self.previous_seen = self.current_seen;
                self.current = Duration::ZERO;
                self.current_seen = false;
                self.window_start = Some(now);
            }
        }
    }

    fn record(&mut self, now: Instant, trailed: Duration) {
        self.roll(now);
        self.current = self.current.max(trailed);
        self.current_seen = true;
    }

    /// The RTT of the latest-sent acknowledged packet (zero before one).
    fn latest_rtt(&self) -> Duration {
        self.latest.map_or(Duration::ZERO, |(sent, acked)| {
            acked.saturating_duration_since(sent)
        })
    }

    /// How much later than the latest acknowledged packet's RTT predicts a packet sent at
    /// `sent` is acknowledged `now`.
    fn trailed(&self, now: Instant, sent: Instant) -> Duration {
        now.saturating_duration_since(sent)
            .saturating_sub(self.latest_rtt())
    }

    /// A packet sent at `sent` was newly acknowledged. Packets of one ACK come oldest first,
    /// so only a packet acknowledged after a later-sent one counts as reordered.
    pub fn on_acked(&mut self, now: Instant, sent: Instant) {
        match self.latest {
            Some((latest, _)) if sent < latest => {
                let trailed = self.trailed(now, sent);
                self.record(now, trailed);
            }
            _ => self.latest = Some((sent, now)),
        }
    }

    /// Packet `pn`, sent at `sent`, was declared lost; `by_outage`: because an outage ended
    /// with it outstanding (its late acknowledgement then says nothing about reordering).
    pub fn on_declared_lost(&mut self, now: Instant, pn: u64, sent: Instant, by_outage: bool) {
        if self.declared.len() >= WATCH_MAX {
            self.declared.pop_first();
        }
        self.declared.insert(pn, (sent, now, !by_outage));
    }

    /// The ranges of one ACK (packet numbers, end exclusive): declared losses they cover were
    /// received after all. Returns how many.
    pub fn on_ack_ranges(
        &mut self,
        now: Instant,
        ranges: impl IntoIterator<Item = Range<u64>>,
        srtt: Duration,
    ) -> u64 {
        // Most ACKs come with no loss declared: nothing to expire or look up.
        if self.declared.is_empty() {
            return 0;
        }
        let watch = WATCH.max(srtt * WATCH_RTTS);
        while self
            .declared
            .first_key_value()
            .is_some_and(|(_, &(_, at, _))| now.saturating_duration_since(at) > watch)
        {
            self.declared.pop_first();
        }
        let mut found = 0;
        for r in ranges.into_iter().filter(|r| r.start < r.end) {
            while let Some((&pn, &(sent, _, reordered))) = self.declared.range(r.clone()).next() {
                self.declared.remove(&pn);
                found += 1;
                if reordered {
                    let trailed = self.trailed(now, sent);
                    self.record(now, trailed);
                }
            }
        }
        self.spurious += found;
        found
    }

    /// The longest reordering of the last one to two windows, if any was seen.
    fn extent(&self, now: Instant) -> Option<Duration> {
        let age = now.saturating_duration_since(self.window_start?);
        if age < WINDOW {
            let previous = self.previous_seen.then_some(self.previous);
            let current = self.current_seen.then_some(self.current);
            current.max(previous)
        } else if age < WINDOW * 2 {
            self.current_seen.then_some(self.current)
        } else {
            None
        }
    }

    /// How long a packet may trail the latest acknowledged later-sent one before it is lost:
    /// `None` while the path does not reorder (the packet count decides), otherwise the
    /// longest reordering seen with a margin, at least an eighth of the RTT (the time rule
    /// of a path that does not reorder) and at most the smoothed RTT (so a real loss is still
    /// found within about two round trips).
    pub fn window(&self, now: Instant, srtt: Duration) -> Option<Duration> {
        let w = self.extent(now)? * MARGIN_NUM / MARGIN_DEN;
        Some(w.max(srtt / 8).min(srtt))
    }

    /// RACK's reference: the latest send time among acknowledged packets and its RTT.
    pub fn latest(&self) -> Option<(Instant, Duration)> {
        self.latest.map(|(sent, _)| (sent, self.latest_rtt()))
    }

    /// Declared losses whose packets turned out to have arrived.
    pub fn spurious(&self) -> u64 {
        self.spurious
    }

    /// The association restarted: packet numbers start again.
    pub fn on_restart(&mut self) {
        self.declared.clear();
        self.latest = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn a_packet_acknowledged_after_a_later_one_opens_the_window() {
        let t0 = Instant::now();
        let mut r = Reordering::default();
        let srtt = ms(100);
        // In order: nothing seen.
        for i in 0..10u64 {
            r.on_acked(t0 + ms(100 + i), t0 + ms(i));
        }
        assert_eq!(r.window(t0 + ms(200), srtt), None);
        // Packet sent at 10 ms overtaken by the one sent at 11 ms, and acknowledged 30 ms
        // after the 100 ms that one took.
        r.on_acked(t0 + ms(111), t0 + ms(11));
        r.on_acked(t0 + ms(140), t0 + ms(10));
        // 30 ms with a quarter more.
        assert_eq!(
            r.window(t0 + ms(200), srtt),
            Some(Duration::from_micros(37_500))
        );
        // Forgotten after two quiet windows.
        assert_eq!(r.window(t0 + ms(200) + WINDOW * 2, srtt), None);
    }

    #[test]
    fn a_declared_loss_acknowledged_later_is_spurious_and_widens_the_window() {
        let t0 = Instant::now();
        let mut r = Reordering::default();
        let srtt = ms(600);
        r.on_acked(t0 + ms(600), t0);
        r.on_declared_lost(t0 + ms(700), 5, t0 + ms(5), false);
        r.on_declared_lost(t0 + ms(700), 6, t0 + ms(6), true);
        r.on_declared_lost(t0 + ms(700), 9, t0 + ms(9), false);
        // 5 and 6 arrive after all (80 ms beyond the RTT); 9 was lost.
        assert_eq!(r.on_ack_ranges(t0 + ms(685), [4..8, 10..12], srtt), 2);
        assert_eq!(r.spurious(), 2);
        assert_eq!(r.window(t0 + ms(700), srtt), Some(ms(100)));
        // Nothing is counted twice, ranges that name nothing are nothing, and old
        // declarations stop being watched.
        assert_eq!(r.on_ack_ranges(t0 + ms(690), Some(4..8), srtt), 0);
        let (hi, lo) = (12, 3);
        assert_eq!(r.on_ack_ranges(t0 + ms(690), Some(hi..lo), srtt), 0);
        assert_eq!(r.on_ack_ranges(t0 + ms(5000), Some(9..10), srtt), 0);
    }

    #[test]
    fn the_window_stays_between_an_eighth_of_the_rtt_and_the_rtt() {
        let t0 = Instant::now();
        let mut r = Reordering::default();
        r.on_acked(t0 + ms(40), t0 + ms(1));
        r.on_acked(t0 + ms(41), t0);
        assert_eq!(r.window(t0 + ms(50), ms(80)), Some(ms(10)));
        r.on_acked(t0 + ms(300), t0 + ms(1) - Duration::from_micros(500));
        assert_eq!(r.window(t0 + ms(310), ms(80)), Some(ms(80)));
    }
}
