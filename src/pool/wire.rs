//! A work unit and its answer on the wire, and the checks a worker runs
//! on what it is sent.

use bytes::Bytes;

use crate::decode::{self, Crop, CropBox, OutputSpec, RandomResizedCrop, SampleKey};
use crate::shard::ImageFormat;

pub mod pb {
    tonic::include_proto!("shardfeed.pool.v1");
}

/// The metadata entry that names the sender's build and decoder.
pub const BUILD_HEADER: &str = "shardfeed-pool-build";

/// What a unit's pixels depend on besides the unit: the crate's version
/// (crop boxes, resize kernels) and the JPEG decoder. Both sides must agree.
pub fn build_identity(decoder: &str) -> String {
    format!("shardfeed {} / {decoder}", env!("CARGO_PKG_VERSION"))
}

/// One sample of a unit, as the sidecar holds it.
#[derive(Debug, Clone)]
pub struct UnitSample {
    pub key: SampleKey,
    pub format: ImageFormat,
    pub data: Bytes,
}

/// A worker's answer for one sample.
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
    use pb::output_spec::Crop as Wire;
    pb::OutputSpec {
        height: spec.height,
        width: spec.width,
        crop: Some(match spec.crop {
            Crop::Center { resize } => Wire::Center(pb::CenterCrop {
                resize: resize.unwrap_or(0),
            }),
            Crop::Stretch => Wire::Stretch(pb::Stretch {}),
            Crop::RandomResized(RandomResizedCrop { scale, ratio }) => {
                Wire::RandomResized(pb::RandomResizedCrop {
                    scale_min: scale.0,
                    scale_max: scale.1,
                    ratio_min: ratio.0,
                    ratio_max: ratio.1,
                })
            }
        }),
        flip: spec.flip,
    }
}

/// The unit's spec, checked as a stream's request is.
pub fn spec_from_wire(wire: Option<&pb::OutputSpec>) -> Result<OutputSpec, UnitError> {
    use pb::output_spec::Crop as Wire;
    let wire = wire.ok_or_else(|| unit_error("spec", "missing"))?;
    for (field, side) in [("spec.height", wire.height), ("spec.width", wire.width)] {
        if side == 0 || side > decode::MAX_SIZE {
            return Err(unit_error(
                field,
                format!("{side} is outside 1..={}", decode::MAX_SIZE),
            ));
        }
    }
    let crop = match &wire.crop {
        None => return Err(unit_error("spec.crop", "missing")),
        Some(Wire::Center(center)) => Crop::Center {
            resize: (center.resize != 0).then_some(center.resize),
        },
        Some(Wire::Stretch(_)) => Crop::Stretch,
        Some(Wire::RandomResized(random)) => Crop::RandomResized(RandomResizedCrop {
            scale: (random.scale_min, random.scale_max),
            ratio: (random.ratio_min, random.ratio_max),
        }),
    };
    let spec = OutputSpec {
        height: wire.height,
        width: wire.width,
        crop,
        flip: wire.flip,
    };
    spec.validate().map_err(|e| UnitError {
        field: "spec",
        message: e.to_string(),
    })?;
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
                format: format_to_wire(sample.format) as i32,
                data: sample.data.clone(),
            })
            .collect(),
    }
}

pub fn answer_to_wire(answer: &SampleAnswer) -> pb::SampleResult {
    use pb::sample_result::Outcome;
    pb::SampleResult {
        outcome: Some(match answer {
            SampleAnswer::Decoded(crop) => Outcome::Crop(pb::CropBox {
                left: crop.left,
                top: crop.top,
                width: crop.width,
                height: crop.height,
                flipped: crop.flipped,
            }),
            SampleAnswer::Failed { reason, message } => Outcome::Failure(pb::Failure {
                reason: reason.clone(),
                message: message.clone(),
            }),
        }),
    }
}

/// A worker's answer, checked against the unit it answers: one result per
/// sample and exactly the pixels they take. `None`: the answer is malformed
/// (the unit is then decoded elsewhere).
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
            Outcome::Crop(crop) => Some(SampleAnswer::Decoded(CropBox {
                left: crop.left,
                top: crop.top,
                width: crop.width,
                height: crop.height,
                flipped: crop.flipped,
            })),
            Outcome::Failure(failure) => Some(SampleAnswer::Failed {
                reason: failure.reason.clone(),
                message: failure.message.clone(),
            }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spec_survives_the_wire() {
        for crop in [
            Crop::Center { resize: None },
            Crop::Center { resize: Some(256) },
            Crop::Stretch,
            Crop::RandomResized(RandomResizedCrop::default()),
        ] {
            let spec = OutputSpec {
                height: 224,
                width: 200,
                crop,
                flip: 0.5,
            };
            assert_eq!(spec_from_wire(Some(&spec_to_wire(&spec))).unwrap(), spec);
        }
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
        wire.flip = 2.0;
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
}
