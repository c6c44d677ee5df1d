//! The association's receive path under an attacker who owns the peer->us direction:
//! the input is a script of made-up, replayed and mutated datagrams, time steps and
//! application actions (see `pepd_fuzz::op`), run against an established pair.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    pepd_fuzz::run_receive(data);
});
