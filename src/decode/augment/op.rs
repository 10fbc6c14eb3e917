//! What an augmentation op is to the rest of the crate: its request
//! parameters checked, its per-sample draw, its effect on an output, and
//! its place on the wire. The table (`ops/mod.rs`) lists the ops; nothing
//! else names one.

use crate::plan::rng::Rng;
use crate::proto::v1 as pb;

/// Bytes per output pixel: RGB.
pub const CHANNELS: usize = 3;

/// A request's augmentation could not be used; names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct AugmentError {
    pub field: &'static str,
    pub message: String,
}

pub(super) fn invalid(field: &'static str, message: String) -> AugmentError {
    AugmentError { field, message }
}

/// One op applied after the crop and resize, to the finished output.
///
/// Each op draws from the sample's generator after the crop has drawn and
/// after every op above it in the table, so adding an op at the end of the
/// table moves no existing sample's box or flip.
pub trait Op: Copy + Default + PartialEq + std::fmt::Debug {
    /// What the op decided for one sample (`bool` for a coin flip).
    type Drawn: Copy + Default + PartialEq + std::fmt::Debug;

    /// The op turned off: what a request that does not name it gets.
    const OFF: Self;

    /// Checks the op's parameters, naming the request field that is wrong.
    fn validate(&self) -> Result<(), AugmentError>;

    /// Whether the op draws anything (the default op must not).
    fn is_random(&self) -> bool;

    /// The op's decision for one sample. An op that is not random must not
    /// draw, so that turning it off leaves the ops below it as they were.
    fn draw(&self, rng: &mut Rng) -> Self::Drawn;

    /// Applies the decision to one output of `width` RGB pixels per row.
    fn apply(drawn: Self::Drawn, width: u32, out: &mut [u8]);

    /// The op's parameters as a request names them (absent: the default).
    fn from_wire(wire: &pb::Augmentation) -> Self;
    fn to_wire(&self, wire: &mut pb::Augmentation);

    /// The op's decision as a batch's `CropBox` reports it.
    fn drawn_from_wire(wire: &pb::CropBox) -> Self::Drawn;
    fn drawn_to_wire(drawn: Self::Drawn, wire: &mut pb::CropBox);
}
