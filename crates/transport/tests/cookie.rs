//! mac1 and the cookie: initiations not keyed for the responder cost it no Diffie-Hellman,
//! and a loaded endpoint answers initiations without a proven address with a COOKIE, whose
//! holder is then served.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use pep_transport::security::{public_key, stamp_initiation_macs};
use pep_transport::{DatagramEvent, EndpointStats, PeerId, ENDPOINT_HANDSHAKE_BURST};
use support::endpoints::{hub_addr, terminal_addr, Hubnet, Layout, HUB};
use support::{geo_secure, INIT, REPLY};

const COOKIE: u8 = 0x84;
const MAC_LEN: usize = 16;
const MS: Duration = Duration::from_millis(1);

fn hub_public_key(n: &Hubnet) -> [u8; 32] {
    public_key(&n.nodes[HUB].key.expect("a secure hub"))
}

/// A hub with one terminal whose first INIT has just left; returns that INIT.
fn hub_and_first_init() -> (Hubnet, Vec<u8>) {
    let mut n = Hubnet::new(&Layout::default());
    assert!(n.step());
    let init = n.nodes[1]
        .sent
        .iter()
        .find(|(_, d)| d[0] == INIT)
        .map(|(_, d)| d.clone())
        .expect("an initiation");
    (n, init)
}

/// `init` with another ephemeral key (so no replay) and mac1 made to fit again, as anyone
/// who knows the hub's public key can: it costs the hub a Diffie-Hellman to refuse.
fn forged(init: &[u8], hub_key: &[u8; 32], i: u32) -> Vec<u8> {
    let mut d = init.to_vec();
    // type, version, scid_len 0, then the ephemeral key.
    d[6..10].copy_from_slice(&i.to_be_bytes());
    stamp_initiation_macs(&mut d, hub_key, None);
    d
}

fn spoofed(i: u32) -> SocketAddr {
    SocketAddr::from(([198, 19, (i >> 8) as u8, i as u8], 40000))
}

#[test]
fn bad_mac1_is_dropped_before_any_diffie_hellman() {
    let (mut n, init) = hub_and_first_init();
    let now = n.now;
    let mut bad = init.clone();
    let last = bad.len() - 2 * MAC_LEN;
    bad[last] ^= 1;
    let hub = &mut n.nodes[HUB].endpoint;
    // Five times the burst: had any of them taken a token (every Diffie-Hellman does), the
    // genuine one below would be refused or asked for a cookie.
    let count = 5 * ENDPOINT_HANDSHAKE_BURST as u64;
    for _ in 0..count {
        assert!(hub.handle(now, terminal_addr(1), &bad).is_none());
    }
    let mut want = EndpointStats::default();
    want.security.handshake_bad_mac = count;
    assert_eq!(hub.stats(), want);
    // Nor did any enter the replay memory: the same INIT with its mac1 is served.
    let Some(DatagramEvent::Initiation { peer, .. }) = hub.handle(now, terminal_addr(1), &init)
    else {
        panic!("the genuine initiation is served");
    };
    assert_eq!(peer, PeerId(1));
    assert_eq!(hub.stats(), want);

    // A standalone association alike: 100 bad ones (its burst is 20), then the genuine
    // one is answered.
    let mut pair = geo_secure(Default::default(), 3, Duration::from_secs(120));
    pair.record_a = Some(Vec::new());
    pair.run_until(MS * 10, |_| false);
    let init = pair.record_a.as_ref().unwrap()[0].clone();
    assert_eq!(init[0], INIT);
    let mut fresh = geo_secure(Default::default(), 4, Duration::from_secs(120));
    let mut bad = init.clone();
    let last = bad.len() - 2 * MAC_LEN;
    bad[last] ^= 1;
    let now = fresh.now;
    for _ in 0..100 {
        fresh.ends[1].handle_datagram(now, &bad);
    }
    assert_eq!(fresh.ends[1].stats().security.handshake_bad_mac, 100);
    fresh.ends[1].handle_datagram(now, &init);
    let mut out = Vec::new();
    let mut replies = Vec::new();
    while fresh.ends[1].poll_transmit(now, &mut out) {
        if out[0] == REPLY {
            replies.push(out.clone());
        }
    }
    assert_eq!(replies.len(), 1);
    let s = fresh.ends[1].stats().security;
    assert_eq!(
        (
            s.handshake_rate_limited,
            s.handshake_replayed,
            s.handshake_invalid
        ),
        (0, 0, 0)
    );
    // The reply's own mac1 is keyed for the initiator: with a byte changed it is refused
    // before the initiator's Diffie-Hellman, and the genuine one still completes.
    let mut bad_reply = replies[0].clone();
    let last = bad_reply.len() - 1;
    bad_reply[last] ^= 1;
    let now = pair.now;
    pair.ends[0].handle_datagram(now, &bad_reply);
    assert_eq!(pair.ends[0].stats().security.handshake_bad_mac, 1);
    assert!(!pair.ends[0].is_established());
    pair.ends[0].handle_datagram(now, &replies[0]);
    assert!(pair.ends[0].is_established());
}

#[test]
fn under_load_an_init_gets_a_cookie_and_the_retry_with_mac2_is_answered() {
    let (mut n, init) = hub_and_first_init();
    let hub_key = hub_public_key(&n);
    let now = n.now;
    let burst = ENDPOINT_HANDSHAKE_BURST;
    // A flood from spoofed addresses: each takes a token (and a Diffie-Hellman) until half
    // the burst is left; from then on each gets a cookie, which goes nowhere.
    let flood = burst;
    let hub = &mut n.nodes[HUB].endpoint;
    let mut cookies_to_spoofed = 0;
    for i in 0..flood {
        match hub.handle(now, spoofed(i), &forged(&init, &hub_key, i)) {
            None => {}
            Some(DatagramEvent::Response {
                destination,
                datagram,
            }) => {
                assert_eq!(destination, spoofed(i));
                assert_eq!(datagram[0], COOKIE);
                cookies_to_spoofed += 1;
            }
            Some(other) => panic!("{other:?}"),
        }
    }
    let served = u64::from(burst / 2 + 1);
    assert_eq!(cookies_to_spoofed, u64::from(flood) - served);
    let mut want = EndpointStats::default();
    want.security.handshake_invalid = served;
    want.cookies_sent = cookies_to_spoofed;
    assert_eq!(hub.stats(), want);

    // The terminal's INIT has no mac2: a COOKIE, smaller than the INIT it answers.
    let Some(DatagramEvent::Response {
        destination,
        datagram: cookie,
    }) = hub.handle(now, terminal_addr(1), &init)
    else {
        panic!("a cookie under load");
    };
    assert_eq!(destination, terminal_addr(1));
    assert_eq!(cookie[0], COOKIE);
    assert_eq!(cookie.len(), 5 + 24 + 16 + 16);
    assert!(
        cookie.len() < init.len(),
        "{} vs {}",
        cookie.len(),
        init.len()
    );
    want.cookies_sent += 1;
    assert_eq!(hub.stats(), want);

    // The terminal sends the same initiation again at once, with mac2.
    let t = n.nodes[1].only();
    let a = &mut n.nodes[1].assocs.get_mut(&t).unwrap().0;
    a.handle_datagram_from(now, hub_addr(), &cookie);
    let mut retry = Vec::new();
    assert_eq!(a.poll_transmit_to(now, &mut retry), Some(hub_addr()));
    let macs = retry.len() - MAC_LEN;
    assert_eq!(retry[..macs], init[..macs]);
    assert_ne!(retry[macs..], [0; MAC_LEN]);
    // A replayed COOKIE changes nothing and is counted.
    a.handle_datagram_from(now, hub_addr(), &cookie);
    let mut out = Vec::new();
    assert_eq!(a.poll_transmit_to(now, &mut out), None);
    assert_eq!(a.stats().security.cookie_invalid, 1);
    // A forged one alike.
    let mut forged_cookie = cookie.clone();
    forged_cookie[20] ^= 1;
    a.handle_datagram_from(now, hub_addr(), &forged_cookie);
    assert_eq!(a.stats().security.cookie_invalid, 2);

    // From another address the cookie proves nothing: another cookie, no work.
    let hub = &mut n.nodes[HUB].endpoint;
    let Some(DatagramEvent::Response { destination, .. }) =
        hub.handle(now, terminal_addr(2), &retry)
    else {
        panic!("a cookie for a different address is refused");
    };
    assert_eq!(destination, terminal_addr(2));
    want.cookies_sent += 1;
    assert_eq!(hub.stats(), want);
    // From the terminal's own address it is served, load or not.
    let Some(DatagramEvent::Initiation { peer, handle, .. }) =
        hub.handle(now, terminal_addr(1), &retry)
    else {
        panic!("the retry with mac2 is served");
    };
    assert_eq!((peer, handle), (PeerId(1), None));
    assert_eq!(hub.stats(), want);
}

#[test]
fn terminal_behind_a_loaded_hub_associates_through_the_cookie() {
    let (mut n, init) = hub_and_first_init();
    let hub_key = hub_public_key(&n);
    let now = n.now;
    for i in 0..ENDPOINT_HANDSHAKE_BURST {
        n.nodes[HUB]
            .endpoint
            .handle(now, spoofed(i), &forged(&init, &hub_key, i));
    }
    // The INIT reaches the hub 100 ms later, still under load; the COOKIE comes back and
    // the retry goes out at once: the terminal has its keys after two round trips, the hub
    // once the first packet under them arrives.
    assert!(n.run_until(MS * 600, |n| n.established([HUB, 1])));
    assert_eq!(n.now - n.base, MS * 500);
    let to_terminal: Vec<u8> = n.nodes[HUB]
        .sent
        .iter()
        .filter(|(to, _)| *to == terminal_addr(1))
        .map(|(_, d)| d[0])
        .take(2)
        .collect();
    assert_eq!(to_terminal, [COOKIE, REPLY]);
}
