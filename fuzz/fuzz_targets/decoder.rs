//! Arbitrary bytes as a received datagram: header, frames, implicit DATA, and the
//! decode/encode round trip of whatever parses.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    pepd_fuzz::check_decoder(data);
});
