//! A work unit and its answer on the wire, and the checks a worker runs
//! on what it is sent.

use bytes::Bytes;

use crate::decode::{self, Crop, CropBox, OutputSpec, SampleKey};
use crate::shard::ImageFormat;

pub use crate::proto::pool::v1 as pb;

/// The metadata entry that names the sender's build and decoder.
pub const BUILD_HEADER: &str = "shardfeed-pool-build";

/// The unit's wire revision: 2 carries the service's `Augmentation` and
/// `CropBox`; 3 their policy, jitter, grayscale and erasing fields; 4 the
/// sample's copy index (repeated augmentation); 5 the crop's resize
/// interpolation (a build before it would resize bicubic units bilinear);
/// 6 the single-op rows; 7 timm's RandAugment; 8 the groups over rows
/// (RandomApply / RandomChoice / RandomOrder) and the rows each sample ran.
/// Builds of one crate version on either side of a change meet in a
/// rolling update, and must refuse each other rather than misread.
const WIRE_REVISION: u32 = 8;

/// What a unit's pixels depend on besides the unit: the crate's version
/// (crop boxes, resize kernels), the unit's wire, the op table (a build
/// that lacks an op would skip it) and the JPEG decoder. Both sides must
/// agree.
pub fn build_identity(decoder: &str) -> String {
    format!(
        "shardfeed {} / wire {WIRE_REVISION} / ops {} / {decoder}",
        env!("CARGO_PKG_VERSION"),
        decode::Ops::NAMES.join(",")
    )
}

/// One sample of a unit, as the sidecar holds it.
#[derive(Debug, Clone)]
pub struct UnitSample {
    pub key: SampleKey,
    pub format: ImageFormat,
    pub data: Bytes,
}

/// A worker's answer for one sample.
///
/// Not boxed, though a `CropBox` (every op's decision) is a few hundred
/// bytes beside a failure's two strings: answers live in a unit's `Vec`,
/// one per sample, where a box would be a heap allocation per sample on
/// the pool's path to save bytes that the vector holds for a moment.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum SampleAnswer {
    Decoded(CropBox),
    Failed { reason: String, message: String },
}

/// A unit the worker cannot take: its message names what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct UnitError {
    pub field: &'static str,
    pub message: String,
}

fn unit_error(field: &'static str, message: impl Into<String>) -> UnitError {
    UnitError {
        field,
        message: message.into(),
    }
}

pub fn spec_to_wire(spec: &OutputSpec) -> pb::OutputSpec {
    pb::OutputSpec {
        height: spec.height,
        width: spec.width,
        augmentation: Some(spec.augmentation_to_wire()),
    }
}

/// The unit's spec, checked as a stream's request is.
pub fn spec_from_wire(wire: Option<&pb::OutputSpec>) -> Result<OutputSpec, UnitError> {
    let wire = wire.ok_or_else(|| unit_error("spec", "missing"))?;
    for (field, side) in [("spec.height", wire.height), ("spec.width", wire.width)] {
        if side == 0 || side > decode::MAX_SIZE {
            return Err(unit_error(
                field,
                format!("{side} is outside 1..={}", decode::MAX_SIZE),
            ));
        }
    }
    let augmentation = wire
        .augmentation
        .as_ref()
        .ok_or_else(|| unit_error("spec.augmentation", "missing"))?;
    let crop = Crop::from_wire(augmentation)
        .ok_or_else(|| unit_error("spec.augmentation.crop", "missing"))?;
    let refused = |e: crate::decode::AugmentError| UnitError {
        field: "spec",
        message: e.to_string(),
    };
    let spec =
        OutputSpec::from_wire(wire.height, wire.width, crop, augmentation).map_err(refused)?;
    spec.validate().map_err(refused)?;
    Ok(spec)
}

pub fn format_to_wire(format: ImageFormat) -> pb::ImageFormat {
    match format {
        ImageFormat::Jpeg => pb::ImageFormat::Jpeg,
        ImageFormat::Png => pb::ImageFormat::Png,
        ImageFormat::Webp => pb::ImageFormat::Webp,
    }
}

pub fn format_from_wire(value: i32) -> Result<ImageFormat, UnitError> {
    match pb::ImageFormat::try_from(value) {
        Ok(pb::ImageFormat::Jpeg) => Ok(ImageFormat::Jpeg),
        Ok(pb::ImageFormat::Png) => Ok(ImageFormat::Png),
        Ok(pb::ImageFormat::Webp) => Ok(ImageFormat::Webp),
        _ => Err(unit_error(
            "samples.format",
            format!("unknown image format {value}"),
        )),
    }
}

pub fn unit_to_wire(unit_id: u64, spec: &OutputSpec, samples: &[UnitSample]) -> pb::DecodeUnit {
    pb::DecodeUnit {
        unit_id,
        spec: Some(spec_to_wire(spec)),
        samples: samples
            .iter()
            .map(|sample| pb::UnitSample {
                seed: sample.key.seed,
                epoch: sample.key.epoch,
                sample: sample.key.sample,
                copy: sample.key.copy,
                format: format_to_wire(sample.format) as i32,
                data: sample.data.clone(),
            })
            .collect(),
    }
}

/// The longest reason or message a failure carries on the wire: a worker
/// cuts longer ones, a sidecar refuses answers that carry them.
pub const MAX_FAILURE_TEXT_BYTES: usize = 512;

/// The most bytes an answer for `samples` outputs of `sample_bytes` each
/// may take on the wire: the pixels, and per sample a result of at most a
/// crop box or two failure texts with their framing. A sidecar reads no
/// answer past it (tonic's per-call message limit), so a worker, honest or
/// not, cannot make it buffer more than the unit it asked for.
pub fn answer_bound(samples: usize, sample_bytes: usize) -> usize {
    const RESULT_FRAMING: usize = 64;
    samples.saturating_mul(sample_bytes + 2 * MAX_FAILURE_TEXT_BYTES + RESULT_FRAMING) + 64
}

/// `text` cut to at most `MAX_FAILURE_TEXT_BYTES`, at a character boundary.
fn failure_text(text: &str) -> String {
    let mut end = text.len().min(MAX_FAILURE_TEXT_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

pub fn answer_to_wire(answer: &SampleAnswer) -> pb::SampleResult {
    use pb::sample_result::Outcome;
    pb::SampleResult {
        outcome: Some(match answer {
            SampleAnswer::Decoded(crop) => Outcome::Crop(crop.to_wire()),
            SampleAnswer::Failed { reason, message } => Outcome::Failure(pb::Failure {
                reason: failure_text(reason),
                message: failure_text(message),
            }),
        }),
    }
}

/// A worker's answer, checked against the unit it answers: one result per
/// sample, exactly the pixels they take, crop boxes of finite, non-negative
/// numbers with a positive size, failure texts within their bound. `None`:
/// the answer is malformed (the unit is then decoded elsewhere, and the
/// worker backs off as a failing one does).
pub fn answers_from_wire(
    answer: &pb::DecodedUnit,
    samples: usize,
    sample_bytes: usize,
) -> Option<Vec<SampleAnswer>> {
    use pb::sample_result::Outcome;
    if answer.results.len() != samples || answer.pixels.len() != samples * sample_bytes {
        return None;
    }
    answer
        .results
        .iter()
        .map(|result| match result.outcome.as_ref()? {
            Outcome::Crop(crop) => {
                let numbers = [crop.left, crop.top, crop.width, crop.height];
                let sound = numbers.iter().all(|v| v.is_finite() && *v >= 0.0)
                    && crop.width > 0.0
                    && crop.height > 0.0;
                sound.then(|| SampleAnswer::Decoded(CropBox::from_wire(crop)))
            }
            Outcome::Failure(failure) => (failure.reason.len() <= MAX_FAILURE_TEXT_BYTES
                && failure.message.len() <= MAX_FAILURE_TEXT_BYTES)
                .then(|| SampleAnswer::Failed {
                    reason: failure.reason.clone(),
                    message: failure.message.clone(),
                }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{Drawn, HorizontalFlip, Ops, RandomResizedCrop};

    #[test]
    fn a_spec_survives_the_wire() {
        // Each crop and op's own round trip is the table's test
        // (`decode::augment::spec`); here, the unit's frame around it.
        let spec = OutputSpec {
            height: 224,
            width: 200,
            crop: Crop::RandomResized(RandomResizedCrop::default()),
            resample: crate::decode::Resample::Bilinear,
            ops: Ops::default().with(HorizontalFlip(0.5)),
        };
        assert_eq!(spec_from_wire(Some(&spec_to_wire(&spec))).unwrap(), spec);
        let mut wire = spec_to_wire(&spec);
        wire.augmentation.as_mut().unwrap().crop = None;
        assert_eq!(
            spec_from_wire(Some(&wire)).unwrap_err().field,
            "spec.augmentation.crop"
        );
        wire.augmentation = None;
        assert_eq!(
            spec_from_wire(Some(&wire)).unwrap_err().field,
            "spec.augmentation"
        );
    }

    #[test]
    fn hostile_specs_name_their_field() {
        let mut wire = spec_to_wire(&OutputSpec::center(224, 224));
        wire.height = decode::MAX_SIZE + 1;
        assert_eq!(
            spec_from_wire(Some(&wire)).unwrap_err().field,
            "spec.height"
        );
        let mut wire = spec_to_wire(&OutputSpec::center(224, 224));
        wire.augmentation.as_mut().unwrap().horizontal_flip = 2.0;
        assert_eq!(spec_from_wire(Some(&wire)).unwrap_err().field, "spec");
        assert_eq!(spec_from_wire(None).unwrap_err().field, "spec");
        assert_eq!(format_from_wire(0).unwrap_err().field, "samples.format");
    }

    #[test]
    fn a_short_answer_is_refused() {
        let answer = pb::DecodedUnit {
            unit_id: 1,
            pixels: Bytes::from(vec![0; 10]),
            results: vec![answer_to_wire(&SampleAnswer::Decoded(CropBox::whole(4, 4)))],
        };
        assert!(answers_from_wire(&answer, 1, 10).is_some());
        assert!(answers_from_wire(&answer, 1, 12).is_none());
        assert!(answers_from_wire(&answer, 2, 5).is_none());
    }

    #[test]
    fn answers_with_unsound_boxes_or_long_texts_are_malformed() {
        let crop = |left: f64, width: f64| {
            answer_to_wire(&SampleAnswer::Decoded(CropBox {
                left,
                top: 0.0,
                width,
                height: 10.0,
                drawn: Drawn::default(),
            }))
        };
        let unit = |result: pb::SampleResult| pb::DecodedUnit {
            results: vec![result],
            pixels: vec![0; 12].into(),
            ..Default::default()
        };
        assert!(answers_from_wire(&unit(crop(1.0, 5.0)), 1, 12).is_some());
        for (left, width) in [
            (f64::NAN, 5.0),
            (1.0, f64::INFINITY),
            (-1.0, 5.0),
            (1.0, 0.0),
        ] {
            assert!(
                answers_from_wire(&unit(crop(left, width)), 1, 12).is_none(),
                "{left} {width}"
            );
        }
        let long = "é".repeat(MAX_FAILURE_TEXT_BYTES);
        let failed = answer_to_wire(&SampleAnswer::Failed {
            reason: "corrupt".into(),
            message: long.clone(),
        });
        // A worker cuts its texts (at a character boundary) ...
        let Some(pb::sample_result::Outcome::Failure(sent)) = &failed.outcome else {
            unreachable!()
        };
        assert!(sent.message.len() <= MAX_FAILURE_TEXT_BYTES && sent.message.starts_with('é'));
        assert!(answers_from_wire(&unit(failed), 1, 12).is_some());
        // ... and a sidecar refuses longer ones.
        let raw = pb::SampleResult {
            outcome: Some(pb::sample_result::Outcome::Failure(pb::Failure {
                reason: "corrupt".into(),
                message: long,
            })),
        };
        assert!(answers_from_wire(&unit(raw), 1, 12).is_none());
    }

    #[test]
    fn the_answer_bound_holds_the_largest_honest_answer() {
        use prost::Message;
        let text = "x".repeat(4 * MAX_FAILURE_TEXT_BYTES);
        let samples = 64;
        let answer = pb::DecodedUnit {
            unit_id: u64::MAX,
            results: (0..samples)
                .map(|_| {
                    answer_to_wire(&SampleAnswer::Failed {
                        reason: text.clone(),
                        message: text.clone(),
                    })
                })
                .collect(),
            pixels: vec![0; samples * 224 * 224 * 3].into(),
        };
        assert!(answer.encoded_len() <= answer_bound(samples, 224 * 224 * 3));
    }
}
