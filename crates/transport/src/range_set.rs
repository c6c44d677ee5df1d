//! Set of disjoint half-open `u64` ranges: received packet numbers, acknowledged or lost
//! stream bytes.

use std::collections::BTreeMap;
use std::ops::{Bound, Range};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeSet {
    /// start -> end, disjoint and non-adjacent.
    map: BTreeMap<u64, u64>,
}

impl RangeSet {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Number of disjoint ranges.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn contains(&self, v: u64) -> bool {
        self.map
            .range(..=v)
            .next_back()
            .is_some_and(|(_, &end)| v < end)
    }

    /// Inserts `r`, merging with overlapping or adjacent ranges. Returns true if anything new
    /// was added.
    pub fn insert(&mut self, r: Range<u64>) -> bool {
        if r.start >= r.end {
            return false;
        }
        let (mut start, mut end) = (r.start, r.end);
        if let Some((&s, &e)) = self.map.range(..=start).next_back() {
            if e >= end {
                return false;
            }
            if e >= start {
                // Extended where it is: the usual case (the next packet number, the next
                // bytes) then rewrites one value instead of removing and reinserting a key.
                start = s;
            }
        }
        while let Some((&s, &e)) = self
            .map
            .range((Bound::Excluded(start), Bound::Included(end)))
            .next()
        {
            end = end.max(e);
            self.map.remove(&s);
        }
        self.map.insert(start, end);
        true
    }

    /// Removes `r` from the set, splitting ranges as needed.
    pub fn remove(&mut self, r: Range<u64>) {
        if r.start >= r.end {
            return;
        }
        if let Some((&s, &e)) = self.map.range(..r.start).next_back() {
            if e > r.start {
                self.map.insert(s, r.start);
                if e > r.end {
                    self.map.insert(r.end, e);
                    return;
                }
            }
        }
        while let Some((&s, &e)) = self.map.range(r.start..r.end).next() {
            self.map.remove(&s);
            if e > r.end {
                self.map.insert(r.end, e);
                break;
            }
        }
    }

    /// Drops everything below `v`.
    pub fn remove_below(&mut self, v: u64) {
        self.remove(0..v);
    }

    pub fn first(&self) -> Option<Range<u64>> {
        self.map.iter().next().map(|(&s, &e)| s..e)
    }

    pub fn last(&self) -> Option<Range<u64>> {
        self.map.iter().next_back().map(|(&s, &e)| s..e)
    }

    pub fn pop_first(&mut self) -> Option<Range<u64>> {
        self.map.pop_first().map(|(s, e)| s..e)
    }

    pub fn iter(&self) -> impl DoubleEndedIterator<Item = Range<u64>> + '_ {
        self.map.iter().map(|(&s, &e)| s..e)
    }

    /// The parts of `r` not in the set, in order.
    pub fn gaps_within(&self, r: Range<u64>) -> Vec<Range<u64>> {
        let mut out = Vec::new();
        let mut cursor = r.start;
        let first_start = self
            .map
            .range(..=r.start)
            .next_back()
            .map_or(r.start, |(&s, _)| s);
        for (&s, &e) in self.map.range(first_start..r.end) {
            if e <= cursor {
                continue;
            }
            if s > cursor {
                out.push(cursor..s.min(r.end));
            }
            cursor = cursor.max(e);
            if cursor >= r.end {
                break;
            }
        }
        if cursor < r.end {
            out.push(cursor..r.end);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn merge_and_split() {
        let mut s = RangeSet::new();
        assert!(s.insert(10..20));
        assert!(s.insert(30..40));
        assert!(s.insert(20..30));
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![10..40]);
        s.remove(15..25);
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![10..15, 25..40]);
        assert!(!s.insert(26..30));
        assert_eq!(s.gaps_within(0..50), vec![0..10, 15..25, 40..50]);
        assert_eq!(s.gaps_within(12..14), Vec::<Range<u64>>::new());
    }

    proptest! {
        #[test]
        fn behaves_like_a_set(ops in proptest::collection::vec((any::<bool>(), 0u64..200, 0u64..20), 0..60)) {
            let mut s = RangeSet::new();
            let mut model = BTreeSet::new();
            for (add, start, len) in ops {
                if add { s.insert(start..start + len); model.extend(start..start + len); }
                else { s.remove(start..start + len); for v in start..start + len { model.remove(&v); } }
            }
            for v in 0..230 { prop_assert_eq!(s.contains(v), model.contains(&v)); }
            // Disjoint and non-adjacent.
            let ranges: Vec<_> = s.iter().collect();
            for w in ranges.windows(2) { prop_assert!(w[0].end < w[1].start); }
            let gaps = s.gaps_within(0..230);
            let gap_count: u64 = gaps.iter().map(|g| g.end - g.start).sum();
            prop_assert_eq!(gap_count, 230 - model.len() as u64);
        }
    }
}
