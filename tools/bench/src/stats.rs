//! Percentiles of samples and the median/min/max summary of rounds.

/// The `p`th percentile of `values` (nearest rank, rounded), sorting them in
/// place; NaN when there are none.
pub fn percentile(values: &mut [f64], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * (values.len() as f64 - 1.0)).round() as usize;
    values[rank.min(values.len() - 1)]
}

/// The rounds of one metric and side: median (mean of the middle two for an
/// even count), min and max of the finite values. What results.md's columns
/// and the charts' bars and whiskers show.
#[derive(Clone, Copy, PartialEq, Debug)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Summary {
    /// `None` when no value is finite.
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Self> {
        let mut sorted: Vec<f64> = values.into_iter().filter(|v| v.is_finite()).collect();
        if sorted.is_empty() {
            return None;
        }
        sorted.sort_by(f64::total_cmp);
        let mid = sorted.len() / 2;
        let median = if sorted.len() % 2 == 1 {
            sorted[mid]
        } else {
            (sorted[mid - 1] + sorted[mid]) / 2.0
        };
        Some(Summary {
            median,
            min: sorted[0],
            max: sorted[sorted.len() - 1],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_is_the_nearest_rank() {
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentile(&mut v, 50.0), 51.0); // rank round(49.5) = 50
        assert_eq!(percentile(&mut v, 99.0), 99.0); // rank round(98.01) = 98
        assert_eq!(percentile(&mut v, 100.0), 100.0);
        assert_eq!(percentile(&mut v, 0.0), 1.0);
        assert_eq!(percentile(&mut [7.0], 99.0), 7.0);
        assert!(percentile(&mut [], 50.0).is_nan());
    }

    #[test]
    fn summary_of_rounds() {
        let s = Summary::of([3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        // An even count: the mean of the middle two.
        assert_eq!(Summary::of([4.0, 1.0, 2.0, 10.0]).unwrap().median, 3.0);
        // A round that measured nothing (NaN, null in JSON) is left out.
        let s = Summary::of([f64::NAN, 5.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (5.0, 5.0, 5.0));
        assert_eq!(Summary::of([f64::NAN]), None);
        assert_eq!(Summary::of([]), None);
    }
}
