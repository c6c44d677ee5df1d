//! The range a setting must lie in, and how a diagnostic states it: `1 to 1000`,
//! `at least 1s`, `at most 1024` (validation adds "must be" and the value).

use std::fmt;
use std::ops::{RangeFrom, RangeInclusive, RangeToInclusive};
use std::time::Duration;

use super::{BitRate, ByteSize};

/// A setting a range check bounds, and how its messages show it.
pub(super) trait Bounded: Copy + PartialOrd {
    /// The value as the file gave it.
    fn show(self) -> String;
    /// A limit, in the largest unit that states it exactly.
    fn show_limit(self) -> String {
        self.show()
    }
}

macro_rules! bounded_by_display {
    ($($t:ty),*) => {$(
        impl Bounded for $t {
            fn show(self) -> String {
                self.to_string()
            }
        }
    )*};
}

bounded_by_display!(u32, u64, usize, BitRate, ByteSize);

impl Bounded for Duration {
    fn show(self) -> String {
        humantime::format_duration(self).to_string()
    }

    /// In the largest unit that divides it: "24h", where humantime would write "1day".
    fn show_limit(self) -> String {
        let millis = self.as_millis();
        for (unit, name) in [(3_600_000, "h"), (60_000, "m"), (1000, "s"), (1, "ms")] {
            if millis > 0 && millis.is_multiple_of(unit) {
                return format!("{}{name}", millis / unit);
            }
        }
        self.show()
    }
}

/// The inclusive range a setting must lie in.
pub(super) enum Bounds<T> {
    Between(T, T),
    AtLeast(T),
    AtMost(T),
}

impl<T: Bounded> Bounds<T> {
    pub(super) fn contains(&self, value: T) -> bool {
        match *self {
            Bounds::Between(min, max) => min <= value && value <= max,
            Bounds::AtLeast(min) => min <= value,
            Bounds::AtMost(max) => value <= max,
        }
    }
}

impl<T: Bounded> fmt::Display for Bounds<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Bounds::Between(min, max) => {
                write!(f, "{} to {}", min.show_limit(), max.show_limit())
            }
            Bounds::AtLeast(min) => write!(f, "at least {}", min.show_limit()),
            Bounds::AtMost(max) => write!(f, "at most {}", max.show_limit()),
        }
    }
}

impl<T: Copy> From<RangeInclusive<T>> for Bounds<T> {
    fn from(r: RangeInclusive<T>) -> Self {
        Bounds::Between(*r.start(), *r.end())
    }
}

impl<T> From<RangeFrom<T>> for Bounds<T> {
    fn from(r: RangeFrom<T>) -> Self {
        Bounds::AtLeast(r.start)
    }
}

impl<T> From<RangeToInclusive<T>> for Bounds<T> {
    fn from(r: RangeToInclusive<T>) -> Self {
        Bounds::AtMost(r.end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_read_in_round_units() {
        let secs = Duration::from_secs;
        assert_eq!(
            Bounds::from(secs(1)..=secs(24 * 3600)).to_string(),
            "1s to 24h"
        );
        assert_eq!(
            Bounds::from(Duration::from_millis(100)..).to_string(),
            "at least 100ms"
        );
        assert_eq!(Bounds::from(..=secs(90)).to_string(), "at most 90s");
        assert_eq!(Bounds::from(..=1024usize).to_string(), "at most 1024");
        assert_eq!(
            Bounds::from(BitRate(8_000)..=BitRate(100_000_000_000)).to_string(),
            "8 kbit/s to 100 Gbit/s"
        );
        assert_eq!(
            Bounds::from(ByteSize(64 << 10)..=ByteSize(1 << 30)).to_string(),
            "64 KiB to 1 GiB"
        );
        assert_eq!(
            secs(2 * 24 * 3600).show(),
            "2days",
            "values read as humantime's"
        );
    }

    #[test]
    fn bounds_hold_their_limits() {
        let between = Bounds::from(1u32..=3);
        assert_eq!(
            [0, 1, 3, 4].map(|v| between.contains(v)),
            [false, true, true, false]
        );
        let at_least = Bounds::from(1u64..);
        assert_eq!(
            [0, 1, u64::MAX].map(|v| at_least.contains(v)),
            [false, true, true]
        );
        let at_most = Bounds::from(..=3usize);
        assert_eq!([0, 3, 4].map(|v| at_most.contains(v)), [true, true, false]);
    }
}
