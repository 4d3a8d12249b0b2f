//! How much work a model may do for its input: the one bound on a model's
//! steps, so its time stays a linear function of what it was given however
//! large each request is or however many blocks are live.
//!
//! A step is a model's unit of work: for the stitched pool a page touched
//! or let go by one request ([`StitchConfig::page_steps`]), for a moving
//! pool a live block one compaction plan looks at. A model past its steps
//! refuses the request with [`Error::StepBudget`], and a replay skips it
//! with that reason.
//!
//! [`StitchConfig::page_steps`]: crate::StitchConfig::page_steps
//! [`Error::StepBudget`]: crate::Error::StepBudget

/// Steps a model may take whatever its input.
pub const MODEL_STEPS_FLOOR: u64 = 1 << 27;

/// Steps a model may take for each request of its input, beyond
/// [`MODEL_STEPS_FLOOR`].
pub const MODEL_STEPS_PER_REQUEST: u64 = 64;

/// The most steps a model of `requests` requests may take: the floor plus a
/// share per request.
///
/// ```
/// assert_eq!(memcore::model_steps(0), memcore::MODEL_STEPS_FLOOR);
/// assert_eq!(memcore::model_steps(10), memcore::MODEL_STEPS_FLOOR + 640);
/// ```
pub const fn model_steps(requests: u64) -> u64 {
    MODEL_STEPS_FLOOR.saturating_add(requests.saturating_mul(MODEL_STEPS_PER_REQUEST))
}
