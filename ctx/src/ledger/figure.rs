//! What the ledger can say about one item's bytes: a prediction from the
//! profile's facts, a bound where a fact is missing, or nothing; and what a
//! reader sees once a device measured it ([`Figure`]).

use std::fmt;

/// What the model says about an item's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prediction {
    /// This many bytes, from the profile's facts, the limits and the
    /// workload.
    Bytes(u64),
    /// No more than this many bytes: what is left once the known items are
    /// taken, where some item is unknown (the free line of a profile that
    /// lacks a figure).
    AtMost(u64),
    /// Nobody measured it on this model and no rule gives it.
    Unknown,
}

impl Prediction {
    /// The bytes, when the model knows them exactly.
    pub const fn bytes(self) -> Option<u64> {
        match self {
            Self::Bytes(bytes) => Some(bytes),
            Self::AtMost(_) | Self::Unknown => None,
        }
    }

    /// The most the item can take, when the model bounds it: its bytes or
    /// its bound.
    pub const fn most(self) -> Option<u64> {
        match self {
            Self::Bytes(bytes) | Self::AtMost(bytes) => Some(bytes),
            Self::Unknown => None,
        }
    }

    /// What the item counts for in a sum of known parts: its bytes, or 0
    /// where it is only bounded or unknown.
    pub const fn known_or_zero(self) -> u64 {
        match self {
            Self::Bytes(bytes) => bytes,
            Self::AtMost(_) | Self::Unknown => 0,
        }
    }

    /// `predicted`, `at_most` or `unknown`, as JSON and tests name it.
    pub const fn state(self) -> &'static str {
        match self {
            Self::Bytes(_) => "predicted",
            Self::AtMost(_) => "at_most",
            Self::Unknown => "unknown",
        }
    }
}

/// In a sentence: `1.5 GiB`, `at most 1.5 GiB` or `unknown`.
impl fmt::Display for Prediction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Bytes(bytes) => f.write_str(&memcore::bytes::human(*bytes)),
            Self::AtMost(bytes) => write!(f, "at most {}", memcore::bytes::human(*bytes)),
            Self::Unknown => f.write_str("unknown"),
        }
    }
}

/// An item's bytes as a reader should take them: measured on a device,
/// predicted by the model, bounded, or unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Figure {
    /// A device showed this many bytes.
    Measured(u64),
    /// The model predicts this many bytes; nothing measured it.
    Predicted(u64),
    /// The model bounds it; nothing measured it.
    AtMost(u64),
    /// Neither measured nor predicted.
    Unknown,
}

impl Figure {
    /// The figure from a prediction and what a device showed, if anything:
    /// a measurement wins.
    pub const fn new(predicted: Prediction, measured: Option<u64>) -> Self {
        match (measured, predicted) {
            (Some(bytes), _) => Self::Measured(bytes),
            (None, Prediction::Bytes(bytes)) => Self::Predicted(bytes),
            (None, Prediction::AtMost(bytes)) => Self::AtMost(bytes),
            (None, Prediction::Unknown) => Self::Unknown,
        }
    }

    /// `measured`, `predicted`, `at_most` or `unknown`.
    pub const fn state(self) -> &'static str {
        match self {
            Self::Measured(_) => "measured",
            Self::Predicted(_) => "predicted",
            Self::AtMost(_) => "at_most",
            Self::Unknown => "unknown",
        }
    }

    /// The bytes it stands for (a bound's bound), if any.
    pub const fn bytes(self) -> Option<u64> {
        match self {
            Self::Measured(bytes) | Self::Predicted(bytes) | Self::AtMost(bytes) => Some(bytes),
            Self::Unknown => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_measurement_wins_and_every_state_is_named() {
        assert_eq!(
            Figure::new(Prediction::Unknown, Some(7)),
            Figure::Measured(7)
        );
        assert_eq!(
            Figure::new(Prediction::Bytes(3), None),
            Figure::Predicted(3)
        );
        assert_eq!(Figure::new(Prediction::AtMost(3), None).state(), "at_most");
        assert_eq!(Figure::new(Prediction::Unknown, None).bytes(), None);
        assert_eq!(Prediction::Unknown.to_string(), "unknown");
        assert_eq!(Prediction::AtMost(2 << 30).to_string(), "at most 2.00 GiB");
        assert_eq!(Prediction::AtMost(5).known_or_zero(), 0);
        assert_eq!(Prediction::AtMost(5).most(), Some(5));
    }
}
