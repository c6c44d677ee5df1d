//! Arbitrary text into the daemon's config parser: it never panics, every error says
//! something, and every config it accepts gives a transport config the transport accepts.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pepd::config::{ConfigError, PepdConfig};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match PepdConfig::parse(text) {
        Ok(cfg) => {
            // The daemon builds its association from this without re-checking.
            let t = cfg.transport();
            if let Err(e) = t.validate() {
                panic!("accepted config gives an invalid transport config: {e}");
            }
            let _ = cfg.tunnel_bind();
            let _ = cfg.role();
        }
        Err(e) => {
            assert!(!e.to_string().trim().is_empty(), "empty error: {e:?}");
            match &e {
                ConfigError::Invalid(ds) => {
                    assert!(!ds.is_empty(), "Invalid without diagnostics");
                    for d in ds {
                        assert!(!d.message.trim().is_empty(), "empty diagnostic: {d:?}");
                    }
                }
                ConfigError::Parse(d) => {
                    assert!(!d.message.trim().is_empty(), "empty diagnostic: {d:?}")
                }
                ConfigError::Read { .. } => unreachable!("parse reads no file"),
            }
        }
    }
});
