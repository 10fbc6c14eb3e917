//! Decode-kernel measurement: the single-thread decode + resize rate, the
//! quality reference (full decode + Lanczos3) and PSNR against it, and a
//! decoder wrapper that adds up the CPU time spent decoding.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use fast_image_resize as fir;

use crate::decode::{
    decode_bounded, decode_rgb, resize_with, CropBox, DecodeError, Decoder, OutputSpec, SampleKey,
    ScratchBudget,
};
use crate::shard::ImageFormat;

pub use crate::decode::psnr;

/// The quality reference: full-resolution decode, then a Lanczos3 resize
/// of the same box (and the same flip).
pub fn reference_decode(
    format: ImageFormat,
    data: &[u8],
    spec: &OutputSpec,
    crop: &CropBox,
    out: &mut [u8],
) -> Result<(), DecodeError> {
    let rgb = decode_rgb(format, data)?;
    let (width, height) = rgb.dimensions();
    resize_with(
        &mut fir::Resizer::new(),
        fir::FilterType::Lanczos3,
        rgb.as_raw(),
        width,
        height,
        crop,
        spec,
        out,
    )?;
    spec.finish(crop, out);
    Ok(())
}

/// The augmentation key of the `index`th benchmark sample.
pub fn kernel_key(index: usize) -> SampleKey {
    SampleKey {
        seed: 0,
        epoch: 0,
        sample: index as u64,
        copy: 0,
    }
}

/// One decoder's single-thread figures over a sample set.
#[derive(Debug, Clone, Copy)]
pub struct KernelFigures {
    /// Samples per second on one thread: header, crop box, decode, resize, flip.
    pub rate: f64,
    /// Mean PSNR against [`reference_decode`] of the same boxes, in dB.
    pub psnr: f64,
}

/// Single-thread rate of `decoder` over `samples` (JPEG bytes), each with
/// its own box from `spec`, through the pipeline's own per-sample call
/// ([`decode_bounded`]), and the mean PSNR of its output against
/// [`reference_decode`] of the same boxes.
pub fn decode_kernel(
    decoder: &dyn Decoder,
    samples: &[Vec<u8>],
    spec: &OutputSpec,
    rounds: usize,
) -> KernelFigures {
    let budget = ScratchBudget::new(1 << 30);
    let mut out = vec![0u8; spec.bytes()];
    let mut reference = vec![0u8; spec.bytes()];
    let mut psnr_sum = 0.0;
    let mut measured = 0usize;
    for (index, jpeg) in samples.iter().enumerate().take(64) {
        let key = kernel_key(index);
        let decoded = decode_bounded(
            decoder,
            &budget,
            ImageFormat::Jpeg,
            jpeg,
            spec,
            &key,
            &mut out,
        );
        if let Ok(crop) = decoded {
            if reference_decode(ImageFormat::Jpeg, jpeg, spec, &crop, &mut reference).is_ok() {
                psnr_sum += psnr(&out, &reference).min(99.0);
                measured += 1;
            }
        }
    }
    let keys: Vec<SampleKey> = (0..samples.len()).map(kernel_key).collect();
    let started = std::time::Instant::now();
    let mut decoded = 0usize;
    for _ in 0..rounds {
        for (jpeg, key) in samples.iter().zip(&keys) {
            if decode_bounded(
                decoder,
                &budget,
                ImageFormat::Jpeg,
                jpeg,
                spec,
                key,
                &mut out,
            )
            .is_ok()
            {
                decoded += 1;
            }
        }
    }
    KernelFigures {
        rate: decoded as f64 / started.elapsed().as_secs_f64(),
        psnr: psnr_sum / measured.max(1) as f64,
    }
}

/// CPU time of the calling thread: unlike wall time, it does not count the
/// time a decode thread waits for a core the other processes hold.
fn thread_cpu_nanos() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid out-pointer; the clock id is a constant.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// A decoder wrapper that adds up the CPU time its threads spend decoding.
#[derive(Debug)]
pub struct TimedDecoder {
    inner: Arc<dyn Decoder>,
    pub nanos: Arc<AtomicU64>,
}

impl TimedDecoder {
    pub fn new(inner: Arc<dyn Decoder>) -> Self {
        Self {
            inner,
            nanos: Arc::default(),
        }
    }
}

impl Decoder for TimedDecoder {
    fn decode_into(
        &self,
        format: ImageFormat,
        data: &[u8],
        spec: &OutputSpec,
        crop: &CropBox,
        out: &mut [u8],
    ) -> Result<(), DecodeError> {
        let started = thread_cpu_nanos();
        let result = self.inner.decode_into(format, data, spec, crop, out);
        self.nanos.fetch_add(
            thread_cpu_nanos().saturating_sub(started),
            Ordering::Relaxed,
        );
        result
    }
}

/// CPU seconds (user + system) this process has used so far, and its peak RSS in bytes.
pub fn cpu_and_peak_rss() -> (f64, u64) {
    // SAFETY: an all-zero rusage is a valid value of the plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid out-pointer for the call.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (
        seconds(usage.ru_utime) + seconds(usage.ru_stime),
        usage.ru_maxrss as u64 * 1024,
    )
}
