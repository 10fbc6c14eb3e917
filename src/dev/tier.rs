//! Stored source forms measured (issue 25): bytes per sample, fidelity
//! against today's full-resolution path, and the single-thread rate of
//! serving a sample from each form beside today's decode, in one run on the
//! demo's ~110 KB photos. Prints JSON lines.

use std::time::Instant;

use crate::decode::source::{derive_source_with, output_from_source, SourceForm, SourceKind};
use crate::decode::{
    decode_bounded, default_decoder, default_decoder_name, psnr, Crop, HorizontalFlip, Ops,
    OutputSpec, RandomResizedCrop, ScratchBudget,
};
use crate::dev::kernel::{decode_kernel, kernel_key, reference_decode};
use crate::dev::synthetic::{synthesize_shards, SyntheticSpec};
use crate::shard::splitter::SampleSplitter;
use crate::shard::{ImageFormat, DEFAULT_MAX_MEMBER_BYTES};

pub struct TierSpec {
    pub samples: usize,
    pub rounds: usize,
}

/// `count` of the demo's photos, as JPEG bytes.
pub(crate) fn photos(count: usize) -> Vec<Vec<u8>> {
    let spec = SyntheticSpec {
        shards: 1,
        samples_per_shard: count,
        ..SyntheticSpec::default()
    };
    let shard = synthesize_shards(&spec).remove(0).1;
    let mut splitter = SampleSplitter::new(0, DEFAULT_MAX_MEMBER_BYTES);
    splitter.push(&shard);
    let mut jpegs = Vec::new();
    while let Ok(Some(sample)) = splitter.next_sample() {
        if let Some((ImageFormat::Jpeg, data)) = sample.image {
            jpegs.push(data.to_vec());
        }
    }
    jpegs
}

/// The training and evaluation recipes the tier is measured on.
pub(crate) fn recipes() -> [(&'static str, OutputSpec); 2] {
    [
        (
            "train_rrc_flip",
            OutputSpec {
                crop: Crop::RandomResized(RandomResizedCrop::default()),
                ops: Ops::default().with(HorizontalFlip(0.5)),
                ..OutputSpec::center(224, 224)
            },
        ),
        (
            "eval_center",
            OutputSpec {
                crop: Crop::Center { resize: Some(256) },
                ..OutputSpec::center(224, 224)
            },
        ),
    ]
}

fn forms() -> Vec<SourceForm> {
    let mut forms = Vec::new();
    for shorter_side in [256, 320, 512] {
        for kind in [
            SourceKind::Raw,
            SourceKind::Yuv420,
            SourceKind::Jpeg { quality: 90 },
            SourceKind::Jpeg { quality: 95 },
        ] {
            forms.push(SourceForm { shorter_side, kind });
        }
    }
    forms
}

pub fn run(spec: &TierSpec) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let jpegs = photos(spec.samples);
    let mean_bytes = jpegs.iter().map(Vec::len).sum::<usize>() as f64 / jpegs.len() as f64;
    let decoder = default_decoder();
    let budget = ScratchBudget::new(1 << 30);
    for (recipe, output) in recipes() {
        // Today's path: header, box, decode (scaled where the decoder can),
        // resize, flip; and its output per sample, the fidelity baseline.
        let today = decode_kernel(decoder.as_ref(), &jpegs, &output, spec.rounds);
        let mut today_outputs = Vec::with_capacity(jpegs.len());
        let mut boxes = Vec::with_capacity(jpegs.len());
        let mut references = Vec::with_capacity(jpegs.len());
        for (index, jpeg) in jpegs.iter().enumerate() {
            let mut out = vec![0u8; output.bytes()];
            let crop = decode_bounded(
                decoder.as_ref(),
                &budget,
                ImageFormat::Jpeg,
                jpeg,
                &output,
                &kernel_key(index),
                &mut out,
            )?;
            let mut reference = vec![0u8; output.bytes()];
            reference_decode(ImageFormat::Jpeg, jpeg, &output, &crop, &mut reference)?;
            today_outputs.push(out);
            boxes.push(crop);
            references.push(reference);
        }
        println!(
            "{}",
            serde_json::json!({
                "recipe": recipe,
                "path": "today",
                "decoder": default_decoder_name(),
                "mean_source_bytes": mean_bytes.round(),
                "samples_per_second_one_thread": today.rate.round(),
                "cpu_ms_per_sample": 1e3 / today.rate,
                "psnr_vs_reference_db": (today.psnr * 100.0).round() / 100.0,
            })
        );
        for form in forms() {
            let started = Instant::now();
            let sources = jpegs
                .iter()
                // As the tier derives: through the decoder's own path.
                .map(|jpeg| derive_source_with(decoder.as_ref(), ImageFormat::Jpeg, jpeg, &form))
                .collect::<Result<Vec<_>, _>>()?;
            let derive_ms = started.elapsed().as_secs_f64() * 1e3 / jpegs.len() as f64;
            let stored =
                sources.iter().map(|s| s.bytes.len()).sum::<usize>() as f64 / sources.len() as f64;
            let mut out = vec![0u8; output.bytes()];
            let (mut vs_today, mut vs_reference) = (0.0, 0.0);
            for (i, source) in sources.iter().enumerate() {
                output_from_source(source, &output, &boxes[i], &mut out)?;
                vs_today += psnr(&out, &today_outputs[i]).min(99.0);
                vs_reference += psnr(&out, &references[i]).min(99.0);
            }
            let started = Instant::now();
            for _ in 0..spec.rounds {
                for (source, crop) in sources.iter().zip(&boxes) {
                    output_from_source(source, &output, crop, &mut out)?;
                }
            }
            let rate = (spec.rounds * sources.len()) as f64 / started.elapsed().as_secs_f64();
            let n = sources.len() as f64;
            println!(
                "{}",
                serde_json::json!({
                    "recipe": recipe,
                    "path": "stored_source",
                    "form": form.to_string(),
                    "stored_bytes_per_sample": stored.round(),
                    "derive_ms_per_sample": (derive_ms * 100.0).round() / 100.0,
                    "samples_per_second_one_thread": rate.round(),
                    "cpu_ms_per_sample": 1e3 / rate,
                    "speedup_vs_today": (rate / today.rate * 100.0).round() / 100.0,
                    "psnr_vs_today_db": (vs_today / n * 100.0).round() / 100.0,
                    "psnr_vs_reference_db": (vs_reference / n * 100.0).round() / 100.0,
                })
            );
        }
    }
    Ok(())
}
