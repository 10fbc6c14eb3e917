//! A work unit and its answer on the wire, and the checks a worker runs
//! on what it is sent.

use std::sync::Arc;

use bytes::Bytes;

use crate::decode::{self, Crop, CropBox, OutputSpec, SampleKey, Views};
use crate::shard::ImageFormat;

pub use crate::proto::pool::v1 as pb;

/// The metadata entry that names the sender's build and decoder.
pub const BUILD_HEADER: &str = "shardfeed-pool-build";

/// The unit's wire revision: 2 carries the service's `Augmentation` and
/// `CropBox`; 3 their policy, jitter, grayscale and erasing fields; 4 the
/// sample's copy index (repeated augmentation); 5 the crop's resize
/// interpolation (a build before it would resize bicubic units bilinear);
/// 6 the single-op rows; 7 timm's RandAugment; 8 the groups over rows
/// (RandomApply / RandomChoice / RandomOrder) and the rows each sample ran;
/// 9 several views per sample (a build before it would read a unit of
/// views as one with no spec).
/// Builds of one crate version on either side of a change meet in a
/// rolling update, and must refuse each other rather than misread.
const WIRE_REVISION: u32 = 9;

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

/// What a unit's samples are decoded into: one output each, or several
/// views each (decoded once for all of them).
///
/// Not boxed: there is one per unit in flight, copied once per unit, and
/// the spec is read for every sample.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum UnitOutput {
    One(OutputSpec),
    Views(Arc<Views>),
}

impl From<OutputSpec> for UnitOutput {
    fn from(spec: OutputSpec) -> Self {
        Self::One(spec)
    }
}

impl From<&OutputSpec> for UnitOutput {
    fn from(spec: &OutputSpec) -> Self {
        Self::One(*spec)
    }
}

impl UnitOutput {
    /// Output bytes of one sample (all its views).
    pub fn sample_bytes(&self) -> usize {
        match self {
            Self::One(spec) => spec.bytes(),
            Self::Views(views) => views.bytes_per_sample(),
        }
    }

    /// Crop boxes in one sample's answer.
    pub fn boxes_per_sample(&self) -> usize {
        match self {
            Self::One(_) => 1,
            Self::Views(views) => views.count(),
        }
    }
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
    /// Each view's box, in the unit's order.
    DecodedViews(Vec<CropBox>),
    Failed {
        reason: String,
        message: String,
    },
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

/// The unit's output: its spec, or its views checked as a stream's
/// request's are (the group and view counts before anything is made of
/// them). A unit sets exactly one of the two.
pub fn output_from_wire(unit: &pb::DecodeUnit) -> Result<UnitOutput, UnitError> {
    if unit.views.is_empty() {
        return spec_from_wire(unit.spec.as_ref()).map(UnitOutput::One);
    }
    if unit.spec.is_some() {
        return Err(unit_error(
            "spec",
            "set beside views: a unit has one or the other",
        ));
    }
    if unit.views.len() > decode::MAX_VIEW_GROUPS {
        return Err(unit_error(
            "views",
            format!(
                "{} groups; at most {}",
                unit.views.len(),
                decode::MAX_VIEW_GROUPS
            ),
        ));
    }
    let mut groups = Vec::with_capacity(unit.views.len());
    for group in &unit.views {
        if group.views.len() > decode::MAX_VIEWS_PER_GROUP as usize {
            return Err(unit_error(
                "views.views",
                format!(
                    "{} views in a group; at most {}",
                    group.views.len(),
                    decode::MAX_VIEWS_PER_GROUP
                ),
            ));
        }
        let views = group
            .views
            .iter()
            .map(|spec| spec_from_wire(Some(spec)))
            .collect::<Result<_, _>>()?;
        groups.push(decode::ViewGroup { views });
    }
    let views = Views { groups };
    views.validate().map_err(|e| UnitError {
        field: "views",
        message: e.to_string(),
    })?;
    Ok(UnitOutput::Views(Arc::new(views)))
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

pub fn unit_to_wire(
    unit_id: u64,
    output: impl Into<UnitOutput>,
    samples: &[UnitSample],
) -> pb::DecodeUnit {
    let (spec, views) = match output.into() {
        UnitOutput::One(spec) => (Some(spec_to_wire(&spec)), Vec::new()),
        UnitOutput::Views(views) => (
            None,
            views
                .groups
                .iter()
                .map(|group| pb::ViewGroup {
                    views: group.views.iter().map(spec_to_wire).collect(),
                })
                .collect(),
        ),
    };
    pb::DecodeUnit {
        unit_id,
        spec,
        views,
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

/// Framing of one result or box on the wire, with room to spare.
const RESULT_FRAMING: usize = 64;

/// The most bytes one crop box takes on the wire: a box is a fixed-size
/// value (every op's decision, at most `MAX_ROWS` rows applied), and the
/// fullest one fits (test `the_fullest_box_fits_its_bound`).
pub const MAX_CROP_BOX_WIRE_BYTES: usize = 2 * MAX_FAILURE_TEXT_BYTES;

/// The most bytes an answer for `samples` samples of `output` may take on
/// the wire: the pixels, and per sample a result of at most its boxes or
/// two failure texts, with their framing. A sidecar reads no answer past it
/// (tonic's per-call message limit), so a worker, honest or not, cannot
/// make it buffer more than the unit it asked for.
pub fn answer_bound(samples: usize, output: &UnitOutput) -> usize {
    let boxes = output.boxes_per_sample() * (MAX_CROP_BOX_WIRE_BYTES + RESULT_FRAMING);
    let result = boxes.max(2 * MAX_FAILURE_TEXT_BYTES) + RESULT_FRAMING;
    samples.saturating_mul(output.sample_bytes() + result) + 64
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
            SampleAnswer::DecodedViews(crops) => Outcome::Views(pb::ViewCrops {
                crops: crops.iter().map(CropBox::to_wire).collect(),
            }),
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
    output: &UnitOutput,
) -> Option<Vec<SampleAnswer>> {
    use pb::sample_result::Outcome;
    if answer.results.len() != samples || answer.pixels.len() != samples * output.sample_bytes() {
        return None;
    }
    let views = matches!(output, UnitOutput::Views(_));
    answer
        .results
        .iter()
        .map(|result| match result.outcome.as_ref()? {
            Outcome::Crop(crop) if !views => sound_box(crop).map(SampleAnswer::Decoded),
            Outcome::Views(crops) if views && crops.crops.len() == output.boxes_per_sample() => {
                crops
                    .crops
                    .iter()
                    .map(sound_box)
                    .collect::<Option<_>>()
                    .map(SampleAnswer::DecodedViews)
            }
            Outcome::Crop(_) | Outcome::Views(_) => None,
            Outcome::Failure(failure) => (failure.reason.len() <= MAX_FAILURE_TEXT_BYTES
                && failure.message.len() <= MAX_FAILURE_TEXT_BYTES)
                .then(|| SampleAnswer::Failed {
                    reason: failure.reason.clone(),
                    message: failure.message.clone(),
                }),
        })
        .collect()
}

/// A box of finite, non-negative numbers with a positive size.
fn sound_box(crop: &crate::proto::v1::CropBox) -> Option<CropBox> {
    let numbers = [crop.left, crop.top, crop.width, crop.height];
    let sound =
        numbers.iter().all(|v| v.is_finite() && *v >= 0.0) && crop.width > 0.0 && crop.height > 0.0;
    sound.then(|| CropBox::from_wire(crop))
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

    fn one(height: u32, width: u32) -> UnitOutput {
        OutputSpec::center(height, width).into()
    }

    #[test]
    fn a_short_answer_is_refused() {
        let answer = pb::DecodedUnit {
            unit_id: 1,
            pixels: Bytes::from(vec![0; 12]),
            results: vec![answer_to_wire(&SampleAnswer::Decoded(CropBox::whole(4, 4)))],
        };
        assert!(answers_from_wire(&answer, 1, &one(2, 2)).is_some());
        assert!(answers_from_wire(&answer, 1, &one(2, 3)).is_none());
        assert!(answers_from_wire(&answer, 2, &one(1, 2)).is_none());
    }

    fn two_groups() -> Views {
        let spec = |side| OutputSpec {
            height: side,
            width: side,
            crop: Crop::RandomResized(RandomResizedCrop::default()),
            resample: crate::decode::Resample::Bicubic,
            ops: Ops::default().with(HorizontalFlip(0.5)),
        };
        Views {
            groups: vec![
                decode::ViewGroup {
                    views: vec![spec(8), OutputSpec::center(8, 8)],
                },
                decode::ViewGroup::repeated(3, spec(4)),
            ],
        }
    }

    fn sample() -> UnitSample {
        UnitSample {
            key: SampleKey {
                seed: 1,
                epoch: 2,
                sample: 3,
                copy: 0,
            },
            format: ImageFormat::Jpeg,
            data: Bytes::from_static(b"x"),
        }
    }

    #[test]
    fn a_unit_of_views_survives_the_wire() {
        let views = Arc::new(two_groups());
        let unit = unit_to_wire(4, UnitOutput::Views(views.clone()), &[sample()]);
        assert!(unit.spec.is_none());
        assert_eq!(output_from_wire(&unit).unwrap(), UnitOutput::Views(views));
        let one = unit_to_wire(4, OutputSpec::center(8, 8), &[sample()]);
        assert!(one.views.is_empty());
        assert_eq!(
            output_from_wire(&one).unwrap(),
            OutputSpec::center(8, 8).into()
        );
    }

    #[test]
    fn hostile_units_of_views_name_their_field() {
        let views = Arc::new(two_groups());
        let unit = unit_to_wire(4, UnitOutput::Views(views), &[sample()]);
        let refused = |unit: &pb::DecodeUnit| output_from_wire(unit).unwrap_err().field;
        let mut both = unit.clone();
        both.spec = Some(spec_to_wire(&OutputSpec::center(8, 8)));
        assert_eq!(refused(&both), "spec");
        let mut groups = unit.clone();
        groups.views = vec![unit.views[1].clone(); decode::MAX_VIEW_GROUPS + 1];
        assert_eq!(refused(&groups), "views");
        let mut crowded = unit.clone();
        crowded.views[1].views =
            vec![unit.views[1].views[0].clone(); decode::MAX_VIEWS_PER_GROUP as usize + 1];
        assert_eq!(refused(&crowded), "views.views");
        let mut empty = unit.clone();
        empty.views[1].views.clear();
        assert_eq!(refused(&empty), "views");
        let mut sizes = unit.clone();
        sizes.views[0].views[1].height = 9;
        assert_eq!(refused(&sizes), "views");
        let mut broken = unit;
        broken.views[0].views[0].augmentation = None;
        assert_eq!(refused(&broken), "spec.augmentation");
    }

    /// An answer of views is one box per view and every view's pixels;
    /// one box for a unit of views (or views for a unit of one output),
    /// or a box short, is malformed.
    #[test]
    fn answers_of_views_match_their_unit() {
        let output = UnitOutput::Views(Arc::new(two_groups()));
        let bytes = output.sample_bytes();
        assert_eq!(bytes, 2 * 8 * 8 * 3 + 3 * 4 * 4 * 3);
        let answer = |boxes: usize| pb::DecodedUnit {
            unit_id: 1,
            pixels: Bytes::from(vec![0; 2 * bytes]),
            results: vec![
                answer_to_wire(&SampleAnswer::DecodedViews(vec![
                    CropBox::whole(4, 4);
                    boxes
                ])),
                answer_to_wire(&SampleAnswer::Failed {
                    reason: "corrupt".into(),
                    message: "no".into(),
                }),
            ],
        };
        let answers = answers_from_wire(&answer(5), 2, &output).unwrap();
        assert!(matches!(&answers[0], SampleAnswer::DecodedViews(b) if b.len() == 5));
        assert!(answers_from_wire(&answer(4), 2, &output).is_none());
        assert!(answers_from_wire(&answer(6), 2, &output).is_none());
        let mut single = answer(5);
        single.results[0] = answer_to_wire(&SampleAnswer::Decoded(CropBox::whole(4, 4)));
        assert!(answers_from_wire(&single, 2, &output).is_none());
        let mut views_for_one = answer(1);
        views_for_one.pixels = Bytes::from(vec![0; 2 * 12]);
        assert!(answers_from_wire(&views_for_one, 2, &one(2, 2)).is_none());
        let mut unsound = answer(5);
        let Some(pb::sample_result::Outcome::Views(crops)) = &mut unsound.results[0].outcome else {
            unreachable!()
        };
        crops.crops[3].width = f32::NAN;
        assert!(answers_from_wire(&unsound, 2, &output).is_none());
    }

    /// The fullest box an honest worker can send: every decision drawn,
    /// every list at its bound, every number at its widest encoding.
    #[test]
    fn the_fullest_box_fits_its_bound() {
        use crate::decode::augment::{MAX_JITTER_STEPS, MAX_POLICY_OPS, MAX_TIMM_LAYERS};
        use crate::proto::v1;
        use prost::Message;
        const WIDE_ENUM: i32 = 16_000;
        let jitter = |n| {
            (0..n)
                .map(|_| v1::JitterStep {
                    op: WIDE_ENUM,
                    factor: 1.5,
                })
                .collect::<Vec<_>>()
        };
        let fullest = v1::CropBox {
            left: 1.5,
            top: 1.5,
            width: 1.5,
            height: 1.5,
            flipped: true,
            policy: (0..MAX_POLICY_OPS)
                .map(|_| v1::PolicyStep {
                    op: WIDE_ENUM,
                    magnitude: 1.5,
                })
                .collect(),
            jitter: jitter(MAX_JITTER_STEPS),
            grayscale: true,
            erased: Some(v1::ErasedBox {
                top: u32::MAX,
                left: u32::MAX,
                height: u32::MAX,
                width: u32::MAX,
                noise: u64::MAX,
            }),
            blur_sigma: Some(1.5),
            solarized: true,
            vertically_flipped: true,
            sharpened: true,
            posterized: true,
            equalized: true,
            autocontrasted: true,
            inverted: true,
            rotation: Some(1.5),
            affine: Some(v1::AffineDrawn {
                angle: 1.5,
                translate_x: i32::MIN,
                translate_y: i32::MIN,
                scale: 1.5,
                shear_x: 1.5,
                shear_y: 1.5,
            }),
            // The distortion draws at most a jitter's steps; two more spare.
            photometric: jitter(MAX_JITTER_STEPS + 2),
            channel_permutation: vec![u32::MAX; 3],
            timm_steps: (0..MAX_TIMM_LAYERS)
                .map(|_| v1::TimmStep {
                    op: WIDE_ENUM,
                    argument: 1.5,
                    resample: WIDE_ENUM,
                })
                .collect(),
            applied_rows: Ops::NAMES.iter().map(|name| (*name).to_string()).collect(),
        };
        let length = fullest.encoded_len();
        assert!(
            length <= MAX_CROP_BOX_WIRE_BYTES,
            "{length} bytes over {MAX_CROP_BOX_WIRE_BYTES}"
        );
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
        assert!(answers_from_wire(&unit(crop(1.0, 5.0)), 1, &one(2, 2)).is_some());
        for (left, width) in [
            (f64::NAN, 5.0),
            (1.0, f64::INFINITY),
            (-1.0, 5.0),
            (1.0, 0.0),
        ] {
            assert!(
                answers_from_wire(&unit(crop(left, width)), 1, &one(2, 2)).is_none(),
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
        assert!(answers_from_wire(&unit(failed), 1, &one(2, 2)).is_some());
        // ... and a sidecar refuses longer ones.
        let raw = pb::SampleResult {
            outcome: Some(pb::sample_result::Outcome::Failure(pb::Failure {
                reason: "corrupt".into(),
                message: long,
            })),
        };
        assert!(answers_from_wire(&unit(raw), 1, &one(2, 2)).is_none());
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
        assert!(answer.encoded_len() <= answer_bound(samples, &one(224, 224)));
        // Of views, the largest is every view's fullest box.
        let views = UnitOutput::Views(Arc::new(Views {
            groups: vec![decode::ViewGroup::repeated(
                decode::MAX_VIEWS_PER_GROUP,
                OutputSpec::center(8, 8),
            )],
        }));
        let fullest_box_bytes = MAX_CROP_BOX_WIRE_BYTES + 8;
        let answer = pb::DecodedUnit {
            unit_id: u64::MAX,
            results: vec![pb::SampleResult::default(); samples],
            pixels: vec![0; samples * views.sample_bytes()].into(),
        };
        let boxes = samples * views.boxes_per_sample() * fullest_box_bytes;
        assert!(answer.encoded_len() + boxes <= answer_bound(samples, &views));
    }
}
