//! Summaries of measured samples shared by the commands that report them.

/// The `q` quantile (nearest rank) of `v`; NaN when empty.
pub fn percentile(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(((s.len().max(1) - 1) as f64 * q).round() as usize)
        .copied()
        .unwrap_or(f64::NAN)
}
