//! A compressed flow's stream of blocks as a hostile peer may send it (pep-compress's
//! decoder, taken as the relay takes it), and the encoder's round trip of the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    pepd_fuzz::check_blocks(data);
});
