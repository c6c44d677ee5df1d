//! A terminal that knows several hubs sharing one key: which of them it is served by, and
//! the trials that move it to another while that one is silent (docs/PROTOCOL.md §10).
//!
//! A silent hub is not a dead one (a rain fade silences every hub), so the terminal moves
//! only to a hub that completed an authenticated handshake with it, and the hub it is on
//! gets the last word: after a candidate answered, one more probe round trip to the
//! current hub, any answer to which cancels the move.

use super::*;
use crate::security::SessionKeys;

/// Most addresses in a terminal's hub list.
pub const MAX_HUBS: usize = 8;

/// The CLOSE code of a terminal leaving a hub for another of its list.
pub const CLOSE_HANDOVER: u8 = 2;

/// Sends of one trial initiation before the next candidate is tried.
const TRIAL_SENDS: u32 = 3;

/// Initiations to the current hub sent unanswered, before the first establishment (or
/// after a restart), before another hub is tried.
const START_SENDS_BEFORE_TRIAL: u32 = 3;

/// The least time the current hub is given to answer once a candidate did.
const MIN_SETTLE: Duration = Duration::from_millis(200);

/// The hubs a terminal may be served by, given by its caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hubs {
    /// In order of preference: the first is the preferred hub.
    pub addresses: Vec<SocketAddr>,
    /// `Some`: go back to the preferred hub after this long on another, at a moment with
    /// no open flow (at most one try per period).
    pub return_after: Option<Duration>,
}

/// The hub list and the trial under way.
pub(super) struct Handover {
    hubs: Hubs,
    /// Index of the hub sent to (`remote`) in `hubs.addresses`.
    current: usize,
    /// The hub tried last, for the order of the next candidate.
    last_tried: Option<usize>,
    trial: Option<Trial>,
    /// The current hub is silent: in an outage, or unanswered before establishment.
    wanted: bool,
    /// Initiations to the current hub sent while not established, none answered.
    start_sends: u32,
    on_alternate_since: Option<Instant>,
    last_return: Option<Instant>,
}

struct Trial {
    hub: usize,
    /// A return to the preferred hub: its answer is taken at once.
    returning: bool,
    sends: u32,
    next_send: Instant,
    answered: Option<Answered>,
}

/// A candidate's reply that authenticated, held while the current hub may still answer.
struct Answered {
    hello: Hello,
    keys: SessionKeys,
    settle_until: Instant,
}

/// Where a handshake reply from some address belongs.
pub(super) enum ReplyFrom {
    /// The hub sent to (or no hub list): the reply to our own initiation.
    Current,
    /// The hub of the trial under way.
    Trial(SocketAddr),
    /// Another hub of the list, not tried now: nothing of ours can match.
    Elsewhere,
}

impl Handover {
    /// The next hub to try after the one tried last (or the current one), in order of
    /// preference, wrapping around; never the current one.
    fn next_candidate(&self) -> Option<usize> {
        let n = self.hubs.addresses.len();
        let from = self.last_tried.unwrap_or(self.current);
        (1..n).map(|k| (from + k) % n).find(|&i| i != self.current)
    }
}

impl Association {
    /// Gives a terminal the hubs it may be served by (docs/PROTOCOL.md §10): the first must
    /// be the address it sends to, and it must be given before anything was sent. With two
    /// or more, the terminal tries the others while its hub is silent, and moves to one only
    /// on its authenticated reply.
    pub fn set_hubs(&mut self, hubs: Hubs) -> Result<(), InvalidConfig> {
        if self.security.is_none() {
            return Err(InvalidConfig::new(
                "hubs",
                "only with security: a move needs a hub's authenticated reply",
            ));
        }
        if self.cfg.initiate != Initiate::Always {
            return Err(InvalidConfig::new(
                "hubs",
                "only at a terminal, which initiates",
            ));
        }
        if hubs.addresses.is_empty() || hubs.addresses.len() > MAX_HUBS {
            return Err(InvalidConfig::new(
                "hubs",
                "between one and eight addresses",
            ));
        }
        let distinct = hubs
            .addresses
            .iter()
            .enumerate()
            .all(|(i, a)| !hubs.addresses[..i].contains(a));
        if !distinct {
            return Err(InvalidConfig::new("hubs", "an address is listed twice"));
        }
        if self.remote != hubs.addresses.first().copied() {
            return Err(InvalidConfig::new(
                "hubs",
                "the first address must be the one the association sends to",
            ));
        }
        if self.stats.packets_sent > 0 {
            return Err(InvalidConfig::new(
                "hubs",
                "given before the association sends anything",
            ));
        }
        self.handover = Some(Box::new(Handover {
            hubs,
            current: 0,
            last_tried: None,
            trial: None,
            wanted: false,
            start_sends: 0,
            on_alternate_since: None,
            last_return: None,
        }));
        Ok(())
    }

    /// Which hub of the list given by [`set_hubs`](Self::set_hubs) serves this terminal:
    /// 0 is the preferred. `None` without a list.
    pub fn hub_rank(&self) -> Option<usize> {
        self.handover.as_ref().map(|h| h.current)
    }

    /// Where a handshake reply from `from` belongs.
    pub(super) fn reply_from(&self, from: Option<SocketAddr>) -> ReplyFrom {
        let (Some(h), Some(from)) = (self.handover.as_ref(), from) else {
            return ReplyFrom::Current;
        };
        if self.remote == Some(from) {
            return ReplyFrom::Current;
        }
        let trial = h.trial.as_ref().filter(|t| t.answered.is_none());
        match trial {
            Some(t) if h.hubs.addresses[t.hub] == from => ReplyFrom::Trial(from),
            _ if h.hubs.addresses.contains(&from) => ReplyFrom::Elsewhere,
            _ => ReplyFrom::Current,
        }
    }

    /// The current hub proved it is there (a packet under its keys, or its reply): a trial
    /// of another hub ends, and none is called for. A return to the preferred hub goes on:
    /// the hub left behind answering is what it expects.
    pub(super) fn current_hub_answered(&mut self) {
        let Some(h) = self.handover.as_mut() else {
            return;
        };
        h.wanted = false;
        h.start_sends = 0;
        if h.trial.as_ref().is_some_and(|t| !t.returning) {
            h.trial = None;
            h.last_tried = None;
            self.stats.handover_trials.stayed += 1;
            if let Some(sec) = self.security.as_mut() {
                sec.end_trial();
            }
        }
    }

    /// The current hub went silent (a probe timeout in an outage): another may be tried.
    pub(super) fn current_hub_silent(&mut self) {
        if let Some(h) = self.handover.as_mut() {
            h.wanted = true;
        }
    }

    /// An initiation to the current hub left while not established: after the third
    /// unanswered one, another hub may be tried.
    pub(super) fn start_initiation_sent(&mut self) {
        if let Some(h) = self.handover.as_mut() {
            h.start_sends += 1;
            if h.start_sends > START_SENDS_BEFORE_TRIAL {
                h.wanted = true;
            }
        }
    }

    /// The next trial initiation, if one is due: written into `out`, with its destination.
    pub(super) fn poll_trial(&mut self, now: Instant, out: &mut Vec<u8>) -> Option<SocketAddr> {
        let hello_interval = self.cfg.hello_interval;
        let hello = self.local_hello();
        let scid = self.local_cid;
        let h = self.handover.as_mut()?;
        let t = h.trial.as_mut()?;
        if t.answered.is_some() || t.sends >= TRIAL_SENDS || t.next_send > now {
            return None;
        }
        let to = h.hubs.addresses[t.hub];
        let encode = || {
            let mut e = Vec::new();
            hello.encode(&mut e);
            e
        };
        let d = self
            .security
            .as_mut()?
            .trial_initiation(now, to, encode, scid)?;
        t.sends += 1;
        t.next_send = now + hello_interval;
        out.extend_from_slice(&d);
        Some(to)
    }

    /// The reply of the trial's hub: the move is made at once when there is nothing to keep
    /// (not established) or when returning; otherwise the current hub is probed once and
    /// the answer held until the settle ends.
    pub(super) fn on_trial_reply(&mut self, now: Instant, from: SocketAddr, datagram: &[u8]) {
        let cid_len = self.local_cid.len();
        let Some(sec) = self.security.as_mut() else {
            return;
        };
        let (hello, split) = match sec.read_trial_reply(now, from, datagram, cid_len) {
            Ok(r) => r,
            Err(d) => {
                d.count(&mut self.stats.security);
                return;
            }
        };
        let Some(h) = self.reply_hello(&hello) else {
            return;
        };
        let Some(sec) = self.security.as_ref() else {
            return;
        };
        let keys = match sec.session_keys(split, &h) {
            Ok(k) => k,
            Err(d) => {
                d.count(&mut self.stats.security);
                return;
            }
        };
        // Bound to our fresh trial initiation: never a replay, whatever its epoch (a hub
        // returned to may answer with the epoch retired when the terminal left it).
        self.retired_peer_epochs.retain(|&e| e != h.epoch);
        let settle = self.rtt.pto(self.cfg.ack.max_delay).max(MIN_SETTLE);
        let established = self.established;
        let idle = self.flows.is_empty();
        let Some(ho) = self.handover.as_mut() else {
            return;
        };
        let Some(t) = ho.trial.as_mut() else {
            return;
        };
        if t.returning && !idle {
            // A flow opened while the return was tried: it would be reset for nothing.
            ho.trial = None;
            self.stats.handover_trials.stayed += 1;
            return;
        }
        let at_once = !established || t.returning;
        t.answered = Some(Answered {
            hello: h,
            keys,
            settle_until: if at_once { now } else { now + settle },
        });
        if at_once {
            self.commit_handover(now);
        } else {
            self.probes_pending = self.probes_pending.max(1);
        }
    }

    /// Moves to the hub whose answer is held: a best-effort CLOSE to the hub left (it
    /// resets its side), every flow reset here, and the association begun with the held
    /// keys, confirmed at once.
    fn commit_handover(&mut self, now: Instant) {
        let Some(ho) = self.handover.as_mut() else {
            return;
        };
        let Some(Trial {
            hub,
            answered: Some(answer),
            ..
        }) = ho.trial.take()
        else {
            return;
        };
        let to = ho.hubs.addresses[hub];
        let from = self.remote.unwrap_or(ho.hubs.addresses[ho.current]);
        ho.current = hub;
        ho.last_tried = None;
        ho.wanted = false;
        ho.start_sends = 0;
        ho.on_alternate_since = (hub != 0).then_some(now);
        if self.established {
            // Sealed before the restart forgets the keys and packet numbers it needs.
            let close = self.sealed_close(CLOSE_HANDOVER, "handover");
            self.restart_association(ResetReason::Handover);
            self.close_pending = close;
            self.close_to = Some(from);
        } else if let Some(sec) = self.security.as_mut() {
            // Nothing was carried yet: flows opened wait for the new hub, and only the
            // initiation to the hub left is dropped (its reply would be stale).
            sec.reset_session();
        }
        self.remote = Some(to);
        self.stats.handovers += 1;
        self.stats.handover_trials.moved += 1;
        // Before `Established`: the flows' resets, the move, then the new association.
        self.events.push_back(Event::Handover { from, to });
        self.start_session(now, answer.hello, answer.keys, |_, _| false);
        self.probes_pending = self.probes_pending.max(1);
    }

    /// Ends trials whose time is up, commits a settled answer, and starts the trial called
    /// for: another hub while the current one is silent, or the preferred hub when it is
    /// time to return.
    pub(super) fn handover_timeout(&mut self, now: Instant) {
        let Some(ho) = self.handover.as_mut() else {
            return;
        };
        if let Some(t) = &ho.trial {
            match &t.answered {
                Some(a) if a.settle_until <= now => return self.commit_handover(now),
                Some(_) => return,
                None if t.sends >= TRIAL_SENDS && t.next_send <= now => {
                    ho.trial = None;
                    self.stats.handover_trials.unanswered += 1;
                    if let Some(sec) = self.security.as_mut() {
                        sec.end_trial();
                    }
                }
                None => return,
            }
        }
        let return_due = self.return_due().is_some_and(|t| t <= now);
        let Some(ho) = self.handover.as_mut() else {
            return;
        };
        let (hub, returning) = if ho.wanted {
            match ho.next_candidate() {
                Some(hub) => (hub, false),
                None => {
                    ho.wanted = false;
                    return;
                }
            }
        } else if return_due {
            ho.last_return = Some(now);
            (0, true)
        } else {
            return;
        };
        ho.last_tried = Some(hub);
        ho.trial = Some(Trial {
            hub,
            returning,
            sends: 0,
            next_send: now,
            answered: None,
        });
    }

    /// When a return to the preferred hub may be tried: on another hub for `return_after`,
    /// at least that long after the last try, the link up and no flow open.
    fn return_due(&self) -> Option<Instant> {
        let ho = self.handover.as_ref()?;
        let period = ho.hubs.return_after?;
        if ho.current == 0
            || ho.trial.is_some()
            || !self.established
            || self.outage_since.is_some()
            || !self.flows.is_empty()
        {
            return None;
        }
        let since = ho.on_alternate_since? + period;
        Some(ho.last_return.map_or(since, |t| since.max(t + period)))
    }

    /// The earliest time the handover has work: a trial's next send or end, a settle's
    /// end, a trial to start, a return due.
    pub(super) fn handover_deadline(&self) -> Option<Instant> {
        let ho = self.handover.as_ref()?;
        match &ho.trial {
            Some(t) => Some(t.answered.as_ref().map_or(t.next_send, |a| a.settle_until)),
            None if ho.wanted => Some(self.last_input),
            None => self.return_due(),
        }
    }
}
