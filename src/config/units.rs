//! Units in the config: bit rates ("1.544Mbit", "100M", or a plain integer of bits per
//! second) and byte sizes ("64MiB", "512k", or a plain integer of bytes).
//!
//! Numbers are parsed as exact decimals, not floats, so "1.544Mbit" is 1 544 000 bit/s and
//! not one bit off. A value that is not a whole number of bits or bytes is an error rather
//! than silently rounded.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::de::{self, Deserialize, Deserializer, Visitor};

const RATE_EXPECTED: &str = "a bit rate like \"1.544Mbit\" or an integer of bits per second";
const SIZE_EXPECTED: &str = "a byte size like \"64MiB\" or an integer of bytes";

/// Bits per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BitRate(pub u64);

impl BitRate {
    pub fn bps(self) -> u64 {
        self.0
    }

    /// Bytes per second, rounded down.
    pub fn bytes_per_sec(self) -> u64 {
        self.0 / 8
    }
}

/// Bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub fn bytes(self) -> u64 {
        self.0
    }
}

/// Why a unit string was rejected. The `Display` text is meant for operators.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    #[error("empty value")]
    Empty,
    #[error("`{0}` does not start with a decimal number")]
    NotANumber(String),
    #[error("unknown unit `{unit}` (use {allowed})")]
    UnknownUnit { unit: String, allowed: &'static str },
    #[error("`{0}` is a byte unit; rates are in bits per second (1 MB/s = \"8Mbit\")")]
    BytesForRate(String),
    #[error("`{0}` is a bit unit; sizes are in bytes, e.g. \"4MB\" or \"4MiB\"")]
    BitsForSize(String),
    #[error("`{0}` is not a whole number of {1}")]
    Fraction(String, &'static str),
    #[error("`{0}` is too large (at most {1})")]
    Overflow(String, u64),
    #[error("negative value {0}")]
    Negative(i64),
}

const RATE_UNITS: &str = "k, M, G or T, optionally followed by bit, bit/s or bps";
const SIZE_UNITS: &str = "B, k, M, G, T (powers of 1000) or Ki, Mi, Gi, Ti (powers of 1024), \
                          optionally followed by B";

impl FromStr for BitRate {
    type Err = UnitError;

    fn from_str(s: &str) -> Result<Self, UnitError> {
        let (number, unit) = split_number(s)?;
        let multiplier = rate_multiplier(unit)?;
        scale(s, number, multiplier, "bits").map(BitRate)
    }
}

impl FromStr for ByteSize {
    type Err = UnitError;

    fn from_str(s: &str) -> Result<Self, UnitError> {
        let (number, unit) = split_number(s)?;
        let multiplier = size_multiplier(unit)?;
        scale(s, number, multiplier, "bytes").map(ByteSize)
    }
}

/// Splits "1.5 Mbit" into ("1.5", "Mbit"), both trimmed.
fn split_number(s: &str) -> Result<(&str, &str), UnitError> {
    let s = s.trim();
    if s.is_empty() {
        return Err(UnitError::Empty);
    }
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(end);
    if !is_decimal(number) {
        return Err(UnitError::NotANumber(s.to_owned()));
    }
    Ok((number, unit.trim_start()))
}

/// Digits, optionally followed by a point and more digits.
fn is_decimal(number: &str) -> bool {
    let mut parts = number.splitn(2, '.');
    let whole = parts.next().unwrap_or("");
    let all_digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    all_digits(whole) && parts.next().is_none_or(all_digits)
}

/// SI prefixes only: line rates are quoted in powers of ten. The prefix is case-insensitive
/// because `tc` writes "mbit"; milli-bits make no sense for a rate, so there is no clash.
fn rate_multiplier(unit: &str) -> Result<u64, UnitError> {
    let (prefix, suffix) = split_prefix(unit);
    if suffix.starts_with('B') {
        return Err(UnitError::BytesForRate(unit.to_owned()));
    }
    let multiplier = match prefix {
        None => 1,
        Some('k' | 'K') => 1_000,
        Some('m' | 'M') => 1_000_000,
        Some('g' | 'G') => 1_000_000_000,
        Some('t' | 'T') => 1_000_000_000_000,
        Some(_) => return Err(unknown(unit, RATE_UNITS)),
    };
    match suffix {
        "" | "bit" | "bits" | "bit/s" | "bits/s" | "bps" | "b/s" => Ok(multiplier),
        _ => Err(unknown(unit, RATE_UNITS)),
    }
}

/// k/K/M/G/T are powers of 1000 as in SI, Ki/Mi/Gi/Ti powers of 1024 as in IEC; a
/// lowercase "b" means bits and is refused rather than guessed.
fn size_multiplier(unit: &str) -> Result<u64, UnitError> {
    let (prefix, rest) = split_prefix(unit);
    let (binary, suffix) = match rest.strip_prefix('i') {
        Some(after) if prefix.is_some() => (true, after),
        _ => (false, rest),
    };
    let power = match prefix {
        None => 0,
        Some('k' | 'K') => 1,
        Some('M') => 2,
        Some('G') => 3,
        Some('T') => 4,
        Some(_) => return Err(unknown(unit, SIZE_UNITS)),
    };
    let base: u64 = if binary { 1024 } else { 1000 };
    match suffix {
        "" | "B" => Ok(base.pow(power)),
        "b" | "bit" | "bits" => Err(UnitError::BitsForSize(unit.to_owned())),
        _ => Err(unknown(unit, SIZE_UNITS)),
    }
}

/// Splits off a leading multiplier letter, if the unit starts with one.
fn split_prefix(unit: &str) -> (Option<char>, &str) {
    let mut chars = unit.chars();
    match chars.next() {
        // "b…"/"B…" is the suffix itself ("bit", "B"), not a prefix.
        Some(c) if c.is_ascii_alphabetic() && c != 'b' && c != 'B' => (Some(c), chars.as_str()),
        _ => (None, unit),
    }
}

fn unknown(unit: &str, allowed: &'static str) -> UnitError {
    UnitError::UnknownUnit {
        unit: unit.to_owned(),
        allowed,
    }
}

/// `number × multiplier`, exactly, as an integer.
fn scale(
    original: &str,
    number: &str,
    multiplier: u64,
    what: &'static str,
) -> Result<u64, UnitError> {
    let overflow = || UnitError::Overflow(original.trim().to_owned(), u64::MAX);
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    let frac = frac.trim_end_matches('0');
    // u128 digits: a u64 has 20 digits, so 38 leaves room for the multiplier.
    if whole.trim_start_matches('0').len() + frac.len() > 38 {
        return Err(overflow());
    }
    let digits = |d: &str| {
        d.bytes().try_fold(0u128, |acc, b| {
            acc.checked_mul(10)?.checked_add(u128::from(b - b'0'))
        })
    };
    let whole = digits(whole).ok_or_else(overflow)?;
    let numerator = digits(frac).ok_or_else(overflow)?;
    let denominator = 10u128
        .checked_pow(u32::try_from(frac.len()).map_err(|_| overflow())?)
        .ok_or_else(overflow)?;
    let m = u128::from(multiplier);
    let frac_scaled = numerator.checked_mul(m).ok_or_else(overflow)?;
    if frac_scaled % denominator != 0 {
        return Err(UnitError::Fraction(original.trim().to_owned(), what));
    }
    let total = whole
        .checked_mul(m)
        .and_then(|w| w.checked_add(frac_scaled / denominator))
        .ok_or_else(overflow)?;
    u64::try_from(total).map_err(|_| overflow())
}

impl fmt::Display for BitRate {
    /// Exact and round-trips through `FromStr`: "1.544 Mbit/s", "9600 bit/s".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const PREFIXES: [(u64, &str, usize); 4] = [
            (1_000_000_000_000, "T", 12),
            (1_000_000_000, "G", 9),
            (1_000_000, "M", 6),
            (1_000, "k", 3),
        ];
        let v = self.0;
        for (unit, prefix, digits) in PREFIXES {
            if v >= unit {
                let frac = format!("{:0digits$}", v % unit);
                let frac = frac.trim_end_matches('0');
                let point = if frac.is_empty() { "" } else { "." };
                return write!(f, "{}{point}{frac} {prefix}bit/s", v / unit);
            }
        }
        write!(f, "{v} bit/s")
    }
}

impl fmt::Display for ByteSize {
    /// The largest unit that divides the size exactly, binary first: "64 MiB", "4 MB".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.0;
        let units = [
            (1u64 << 40, "TiB"),
            (1 << 30, "GiB"),
            (1 << 20, "MiB"),
            (1 << 10, "KiB"),
            (1_000_000_000_000, "TB"),
            (1_000_000_000, "GB"),
            (1_000_000, "MB"),
            (1_000, "kB"),
        ];
        match units
            .iter()
            .find(|(unit, _)| v != 0 && v.is_multiple_of(*unit))
        {
            Some((unit, name)) => write!(f, "{} {name}", v / unit),
            None => write!(f, "{v} B"),
        }
    }
}

/// Accepts TOML integers and unit strings; `expected` is what the error messages ask for.
struct UnitVisitor<T> {
    expected: &'static str,
    make: fn(u64) -> T,
}

impl<T: FromStr<Err = UnitError>> Visitor<'_> for UnitVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.expected)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
        Ok((self.make)(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
        u64::try_from(v).map(self.make).map_err(|_| {
            E::custom(format!(
                "{}; expected {}",
                UnitError::Negative(v),
                self.expected
            ))
        })
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        v.parse()
            .map_err(|e: UnitError| E::custom(format!("{e}; expected {}", self.expected)))
    }
}

impl<'de> Deserialize<'de> for BitRate {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(UnitVisitor {
            expected: RATE_EXPECTED,
            make: BitRate,
        })
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(UnitVisitor {
            expected: SIZE_EXPECTED,
            make: ByteSize,
        })
    }
}

/// A duration as an operator writes it ("2m 30s").
pub(crate) fn dur(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// "5.7 MiB": sizes computed from rates are rarely round, and exact bytes are noise here.
pub(crate) fn approx(bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (unit, name) in UNITS {
        if bytes >= unit {
            let tenths = (u128::from(bytes) * 10 + u128::from(unit) / 2) / u128::from(unit);
            return match tenths % 10 {
                0 => format!("{} {name}", tenths / 10),
                t => format!("{}.{t} {name}", tenths / 10),
            };
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(s: &str) -> Result<u64, UnitError> {
        s.parse::<BitRate>().map(BitRate::bps)
    }

    fn size(s: &str) -> Result<u64, UnitError> {
        s.parse::<ByteSize>().map(ByteSize::bytes)
    }

    #[test]
    fn bit_rates_from_strings() {
        let cases = [
            ("1.544Mbit", 1_544_000),
            ("1.544 Mbit/s", 1_544_000),
            ("100M", 100_000_000),
            ("512k", 512_000),
            ("512K", 512_000),
            ("2G", 2_000_000_000),
            ("9600", 9600),
            ("9600bps", 9600),
            ("10Mbps", 10_000_000),
            ("10 mbit", 10_000_000),
            ("2.5Gbit/s", 2_500_000_000),
            ("64kbit", 64_000),
            ("1T", 1_000_000_000_000),
            ("  8000  ", 8000),
            ("1.000", 1),
            ("0.5k", 500),
            ("007M", 7_000_000),
        ];
        for (text, bps) in cases {
            assert_eq!(rate(text), Ok(bps), "{text}");
        }
    }

    #[test]
    fn bit_rate_errors() {
        assert_eq!(rate(""), Err(UnitError::Empty));
        assert_eq!(rate("fast"), Err(UnitError::NotANumber("fast".into())));
        assert_eq!(rate("1.5.4M"), Err(UnitError::NotANumber("1.5.4M".into())));
        assert_eq!(rate(".5M"), Err(UnitError::NotANumber(".5M".into())));
        assert_eq!(rate("5.M"), Err(UnitError::NotANumber("5.M".into())));
        assert_eq!(rate("-5M"), Err(UnitError::NotANumber("-5M".into())));
        assert!(matches!(rate("10MB/s"), Err(UnitError::BytesForRate(_))));
        assert!(matches!(rate("10MBps"), Err(UnitError::BytesForRate(_))));
        assert!(matches!(
            rate("10Mibit"),
            Err(UnitError::UnknownUnit { .. })
        ));
        assert!(matches!(rate("10X"), Err(UnitError::UnknownUnit { .. })));
        assert!(matches!(
            rate("10 Mbit/h"),
            Err(UnitError::UnknownUnit { .. })
        ));
        assert_eq!(
            rate("1.5bit"),
            Err(UnitError::Fraction("1.5bit".into(), "bits"))
        );
        assert_eq!(
            rate("1.0000001k"),
            Err(UnitError::Fraction("1.0000001k".into(), "bits"))
        );
    }

    #[test]
    fn overflow_is_an_error_not_a_wrap() {
        assert_eq!(rate("18446744073709551615"), Ok(u64::MAX));
        assert!(matches!(
            rate("18446744073709551616"),
            Err(UnitError::Overflow(..))
        ));
        assert!(matches!(rate("20000000T"), Err(UnitError::Overflow(..))));
        assert!(matches!(
            rate("99999999999999999999999999999999999999999999"),
            Err(UnitError::Overflow(..))
        ));
        assert!(matches!(size("16EiB"), Err(UnitError::UnknownUnit { .. })));
        assert!(matches!(size("16777216TiB"), Err(UnitError::Overflow(..))));
        assert_eq!(size("16777215TiB"), Ok(16_777_215 << 40));
        // Many fractional digits that cancel are still exact.
        assert_eq!(rate("1.000000000000000000000000000000000000000k"), Ok(1000));
    }

    #[test]
    fn byte_sizes_from_strings() {
        let cases = [
            ("64MiB", 64 << 20),
            ("512KiB", 512 << 10),
            ("512kiB", 512 << 10),
            ("1GiB", 1 << 30),
            ("1.5GiB", 3 << 29),
            ("2TiB", 2 << 40),
            ("4MB", 4_000_000),
            ("4M", 4_000_000),
            ("512k", 512_000),
            ("512K", 512_000),
            ("512kB", 512_000),
            ("64 MiB", 64 << 20),
            ("4096", 4096),
            ("4096B", 4096),
            ("4096 B", 4096),
            ("0.5KiB", 512),
            ("1Mi", 1 << 20),
        ];
        for (text, bytes) in cases {
            assert_eq!(size(text), Ok(bytes), "{text}");
        }
    }

    #[test]
    fn byte_size_errors() {
        assert!(matches!(size("4Mb"), Err(UnitError::BitsForSize(_))));
        assert!(matches!(size("4Mbit"), Err(UnitError::BitsForSize(_))));
        assert!(matches!(size("512m"), Err(UnitError::UnknownUnit { .. })));
        assert!(matches!(size("1iB"), Err(UnitError::UnknownUnit { .. })));
        assert!(matches!(size("1 MiBs"), Err(UnitError::UnknownUnit { .. })));
        assert_eq!(
            size("0.1B"),
            Err(UnitError::Fraction("0.1B".into(), "bytes"))
        );
        assert_eq!(
            size("1.0001k"),
            Err(UnitError::Fraction("1.0001k".into(), "bytes"))
        );
        assert_eq!(size(""), Err(UnitError::Empty));
        assert_eq!(size("MiB"), Err(UnitError::NotANumber("MiB".into())));
    }

    #[test]
    fn display_round_trips() {
        // A fixed pseudo-random walk over magnitudes, so failures reproduce.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut values = vec![0, 1, 999, 1000, 1001, 1_544_000, u64::MAX, 1 << 40];
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            values.push(x >> (x % 64));
        }
        for v in values {
            let r = BitRate(v).to_string();
            assert_eq!(r.parse::<BitRate>(), Ok(BitRate(v)), "{r}");
            let s = ByteSize(v).to_string();
            assert_eq!(s.parse::<ByteSize>(), Ok(ByteSize(v)), "{s}");
        }
    }

    #[test]
    fn display_picks_readable_units() {
        assert_eq!(BitRate(1_544_000).to_string(), "1.544 Mbit/s");
        assert_eq!(BitRate(10_000_000).to_string(), "10 Mbit/s");
        assert_eq!(BitRate(9600).to_string(), "9.6 kbit/s");
        assert_eq!(BitRate(999).to_string(), "999 bit/s");
        assert_eq!(ByteSize(64 << 20).to_string(), "64 MiB");
        assert_eq!(ByteSize(4_000_000).to_string(), "4 MB");
        assert_eq!(ByteSize(1536).to_string(), "1536 B");
        assert_eq!(ByteSize(0).to_string(), "0 B");
    }

    #[derive(Debug, serde::Deserialize)]
    struct Holder {
        rate: BitRate,
        size: ByteSize,
    }

    fn holder(text: &str) -> Result<Holder, String> {
        toml::from_str(text).map_err(|e: toml::de::Error| e.message().to_owned())
    }

    #[test]
    fn deserializes_integers_and_strings() {
        let h = holder("rate = 1544000\nsize = \"64MiB\"").expect("valid");
        assert_eq!((h.rate, h.size), (BitRate(1_544_000), ByteSize(64 << 20)));
        let h = holder("rate = \"1.544Mbit\"\nsize = 4096").expect("valid");
        assert_eq!((h.rate, h.size), (BitRate(1_544_000), ByteSize(4096)));
    }

    #[test]
    fn deserialize_errors_say_what_is_expected() {
        let e = holder("rate = \"fast\"\nsize = 1").unwrap_err();
        assert_eq!(
            e,
            "`fast` does not start with a decimal number; expected a bit rate like \
             \"1.544Mbit\" or an integer of bits per second"
        );
        let e = holder("rate = -5\nsize = 1").unwrap_err();
        assert!(
            e.starts_with("negative value -5; expected a bit rate"),
            "{e}"
        );
        let e = holder("rate = 1.5e6\nsize = 1").unwrap_err();
        assert!(e.contains("expected a bit rate like"), "{e}");
        let e = holder("rate = 1\nsize = \"4Mb\"").unwrap_err();
        assert!(e.contains("expected a byte size like \"64MiB\""), "{e}");
    }

    #[test]
    fn approx_rounds_to_a_tenth() {
        assert_eq!(approx(0), "0 B");
        assert_eq!(approx(1023), "1023 B");
        assert_eq!(approx(1024), "1 KiB");
        assert_eq!(approx(6_000_000), "5.7 MiB");
        assert_eq!(approx(4 << 20), "4 MiB");
        assert_eq!(approx(u64::MAX), "17179869184 GiB");
    }
}
