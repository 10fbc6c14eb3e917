//! Several views from one decode, checked: each view is what its own
//! decode makes, and the cover holds every box at the scale needed.

use super::augment::{Crop, Ops, OutputSpec, Resample, SampleKey, Views};
use super::{
    covering, decode_bounded, decode_views_bounded, ImageCrateDecoder, ScratchBudget, ViewOut,
};
use crate::decode::augment::{
    Coin, GaussianBlur, HorizontalFlip, RandomResizedCrop, Solarize, ViewGroup,
};
use crate::shard::ImageFormat;

fn photo(width: u32, height: u32) -> Vec<u8> {
    let image = image::RgbImage::from_fn(width, height, |x, y| {
        let r = ((x * 7 + y * 3) % 256) as u8;
        let g = ((x / 3 + y * 5) % 256) as u8;
        let b = (((x ^ y) * 11) % 256) as u8;
        image::Rgb([r, g, b])
    });
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 90)
        .encode_image(&image)
        .unwrap();
    out
}

fn view(side: u32, scale: (f64, f64), ops: Ops) -> OutputSpec {
    OutputSpec {
        height: side,
        width: side,
        crop: Crop::RandomResized(RandomResizedCrop {
            scale,
            ..RandomResizedCrop::default()
        }),
        resample: Resample::Bicubic,
        ops,
    }
}

/// DINOv2's views with their flips, blurs and solarize.
fn dino() -> Views {
    let blur = |p| GaussianBlur {
        kernel: (9, 9),
        sigma: (0.1, 2.0),
        p,
    };
    let flip = HorizontalFlip(0.5);
    let first = Ops {
        horizontal_flip: flip,
        gaussian_blur: blur(1.0),
        ..Ops::NONE
    };
    let second = Ops {
        horizontal_flip: flip,
        gaussian_blur: blur(0.1),
        solarize: Coin {
            kernel: Solarize { threshold: 128.0 },
            p: 0.2,
        },
        ..Ops::NONE
    };
    let local = Ops {
        horizontal_flip: flip,
        gaussian_blur: blur(0.5),
        ..Ops::NONE
    };
    Views {
        groups: vec![
            ViewGroup {
                views: vec![
                    view(224, (0.32, 1.0), first),
                    view(224, (0.32, 1.0), second),
                ],
            },
            ViewGroup::repeated(8, view(96, (0.05, 0.32), local)),
        ],
    }
}

fn key(sample: u64) -> SampleKey {
    SampleKey {
        seed: 5,
        epoch: 0,
        sample,
        copy: 0,
    }
}

fn outputs(views: &Views) -> Vec<Vec<u8>> {
    views.specs().map(|spec| vec![0u8; spec.bytes()]).collect()
}

/// Each view decoded together is, byte for byte, the view decoded alone
/// with its own key: the decode is shared, nothing else is.
#[test]
fn each_view_is_what_its_own_decode_makes() {
    let views = dino();
    views.validate().unwrap();
    let jpeg = photo(500, 375);
    let budget = ScratchBudget::new(1 << 30);
    for sample in 0..4 {
        let mut outs = outputs(&views);
        let mut slices: Vec<&mut [u8]> = outs.iter_mut().map(Vec::as_mut_slice).collect();
        let plan = decode_views_bounded(
            &ImageCrateDecoder,
            &budget,
            ImageFormat::Jpeg,
            &jpeg,
            &views,
            &key(sample),
            &mut slices,
        )
        .unwrap();
        let specs = views.groups.iter().enumerate().flat_map(|(g, group)| {
            group
                .views
                .iter()
                .enumerate()
                .map(move |(v, spec)| (g as u32, v as u32, spec))
        });
        for (i, (g, v, spec)) in specs.enumerate() {
            let mut alone = vec![0u8; spec.bytes()];
            let own_key = crate::decode::augment::view_key(&key(sample), g, v);
            let crop = decode_bounded(
                &ImageCrateDecoder,
                &budget,
                ImageFormat::Jpeg,
                &jpeg,
                spec,
                &own_key,
                &mut alone,
            )
            .unwrap();
            assert_eq!(crop, plan.boxes[i], "view {i}: the same decisions");
            assert!(outs[i] == alone, "view {i}: the same pixels");
        }
    }
}

/// The covering box holds every box and its filter's reach; its spec
/// asks the scale the most demanding view needs.
#[test]
fn the_cover_holds_every_box_at_the_largest_scale_needed() {
    let views = dino();
    let plan = views.plan(800, 600, &key(1));
    let mut outs = outputs(&views);
    let made = ViewOut::paired(
        views.specs(),
        &plan.boxes,
        outs.iter_mut().map(Vec::as_mut_slice),
    );
    let (cover, spec) = covering(&made);
    for crop in &plan.boxes {
        assert!(cover.left + 9.0 < crop.left && cover.top + 9.0 < crop.top);
        assert!(crop.left + crop.width + 9.0 < cover.left + cover.width);
        assert!(crop.top + crop.height + 9.0 < cover.top + cover.height);
    }
    let asked = (f64::from(spec.width) / cover.width).max(f64::from(spec.height) / cover.height);
    assert!(
        asked >= plan.scale_needed,
        "{asked} < {}",
        plan.scale_needed
    );
    assert!(asked < plan.scale_needed * 1.01 + 0.01);
    assert_eq!(spec.resample, Resample::Bicubic);
}
