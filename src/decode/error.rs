//! Why one image could not be decoded.

/// Images with more pixels than this are rejected rather than decoded
/// (decompression bombs).
pub const MAX_SOURCE_PIXELS: u64 = 100_000_000;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("corrupt or unsupported image: {0}")]
    Corrupt(String),
    #[error("image of {width}x{height} exceeds the {MAX_SOURCE_PIXELS}-pixel limit")]
    TooLarge { width: u32, height: u32 },
    #[error("resize failed: {0}")]
    Resize(String),
    #[error(
        "image of {width}x{height} needs {bytes} bytes to decode, more than the decode \
         memory budget of {budget} bytes"
    )]
    OverBudget {
        width: u32,
        height: u32,
        bytes: u64,
        budget: u64,
    },
    #[error("the decoder panicked: {0}")]
    Panicked(String),
}

impl DecodeError {
    /// A short, bounded reason for metrics labels.
    pub fn reason(&self) -> &'static str {
        match self {
            DecodeError::Corrupt(_) => "corrupt",
            DecodeError::TooLarge { .. } => "too_large",
            DecodeError::Resize(_) => "resize",
            DecodeError::OverBudget { .. } => "over_budget",
            DecodeError::Panicked(_) => "panic",
        }
    }
}
