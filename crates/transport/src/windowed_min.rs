//! The least of a series over the last one to two windows of time: kept over two alternating
//! windows, so a minimum that rises (a longer path) is adopted within two windows instead
//! of never, at the cost of two values of state.

use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct WindowedMin<T> {
    window: Duration,
    start: Option<Instant>,
    current: Option<T>,
    previous: Option<T>,
}

impl<T: Ord + Copy> WindowedMin<T> {
    pub fn new(window: Duration) -> Self {
        WindowedMin {
            window,
            start: None,
            current: None,
            previous: None,
        }
    }

    /// Adds `value`, seen at `now`; a window that has run out becomes the previous one.
    pub fn add(&mut self, now: Instant, value: T) {
        match self.start {
            Some(start) if now.saturating_duration_since(start) < self.window => {}
            _ => {
                self.previous = self.current.take();
                self.start = Some(now);
            }
        }
        self.current = Some(self.current.map_or(value, |c| c.min(value)));
    }

    /// The least value of the current and the previous window; `None` before any.
    pub fn get(&self) -> Option<T> {
        match (self.current, self.previous) {
            (Some(c), Some(p)) => Some(c.min(p)),
            (c, p) => c.or(p),
        }
    }

    /// Forgets every value before `value`, seen at `now`, which opens a new window.
    pub fn restart(&mut self, now: Instant, value: T) {
        self.previous = None;
        self.current = Some(value);
        self.start = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raised_minimum_is_adopted_within_two_windows() {
        let s = Duration::from_secs;
        let t0 = Instant::now();
        let mut m = WindowedMin::new(s(10));
        assert_eq!(m.get(), None);
        m.add(t0, 5);
        m.add(t0 + s(5), 9);
        assert_eq!(m.get(), Some(5));
        // The next window keeps the previous one's least...
        m.add(t0 + s(12), 9);
        assert_eq!(m.get(), Some(5));
        // ... and the one after forgets it.
        m.add(t0 + s(25), 9);
        assert_eq!(m.get(), Some(9));
        m.restart(t0 + s(26), 20);
        assert_eq!(m.get(), Some(20));
    }
}
