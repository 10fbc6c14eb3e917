//! Where a sample of an encoded batch lies, and in which form.

/// Where one sample is in a batch's bytes, and in which form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub offset: usize,
    pub length: usize,
    /// Final pixels (`spec.bytes()` long); else the compressed JPEG.
    pub decoded: bool,
    /// The compressed image's size (0 for decoded slots).
    pub source_width: u32,
    pub source_height: u32,
}
