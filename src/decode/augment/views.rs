//! Several views of one sample (DINO's global and local crops, SimCLR's
//! two views): groups of views, each group with its own output size,
//! crop, resize and ops, every view's decisions drawn from a key of its
//! own, and the one source region a sample decodes for all of them.
//!
//! # Keys
//!
//! A view's decisions draw from the sample's key re-keyed by (group, view
//! index): its sample identity becomes `Rng::derive([PURPOSE_VIEW,
//! sample, group, view])`'s first draw, so the crop and flip generator and
//! every op's generator of a view are functions of (seed, epoch, sample,
//! copy, group, view, op) alone. Views are then independent of each other,
//! of the world size, the resume point and thread timing. (Two streams of
//! one view each zipped by key are not: under one seed their crops are the
//! same, and a global and a local stream's draws are correlated; the test
//! below measures ours.)
//!
//! # One region
//!
//! A sample is decoded once, as one region covering every view's box (the
//! union's bounding box plus the resize filter's margin), at the DCT scale
//! the most demanding view needs (the largest output-to-box ratio). Two
//! regions are not decoded even when a global and a local box lie far
//! apart: a JPEG's entropy-coded data is read in order, so a second region
//! would decode the rows up to it a second time, and the union of the
//! boxes is at most the whole image, one full decode; the views are then
//! resized from that one region.

use super::key::SampleKey;
use super::op::{invalid, AugmentError};
use super::spec::{CropBox, OutputSpec, MAX_SIZE};
use crate::plan::rng::Rng;

/// Keeps the views' keys apart from the plan's, the augmentation's and
/// the copies' streams.
const PURPOSE_VIEW: u64 = 5;
/// Most groups one request may ask (DINO's two; room for recipes with a
/// few more resolutions).
pub const MAX_VIEW_GROUPS: usize = 8;
/// Most views of one group (DINOv2 takes 8 to 10 local crops).
pub const MAX_VIEWS_PER_GROUP: u32 = 32;
/// Most output bytes one sample's views may hold together: sixteen
/// 1024² outputs, so a batch's bytes stay what the memory formula can
/// admit (`batch size × this`).
pub const MAX_VIEW_BYTES_PER_SAMPLE: usize = 16 * 1024 * 1024 * 3;

/// One group of views of one output size, delivered as one array,
/// `[batch × views, height, width, 3]`: each view its own spec (crop,
/// resize, ops), as DINO's two global crops differ in their blur and
/// solarize, or the same spec repeated ([`ViewGroup::repeated`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ViewGroup {
    pub views: Vec<OutputSpec>,
}

impl ViewGroup {
    /// `count` views of one spec (DINO's local crops).
    pub fn repeated(count: u32, spec: OutputSpec) -> Self {
        Self {
            views: vec![spec; count as usize],
        }
    }

    /// The group's output size, `(height, width)` (its first view's).
    pub fn size(&self) -> (u32, u32) {
        self.views.first().map_or((0, 0), |v| (v.height, v.width))
    }

    fn count(&self) -> usize {
        self.views.len()
    }
}

/// The view groups of a stream, in the request's order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Views {
    pub groups: Vec<ViewGroup>,
}

/// A sample's views decided before decoding: each view's box and ops'
/// decisions (group by group, view by view), and the one region of the
/// source decoded for all of them.
#[derive(Debug, Clone, PartialEq)]
pub struct ViewsPlan {
    pub boxes: Vec<CropBox>,
    /// Left, top, right, bottom in source pixels: the union of the boxes.
    pub region: (f64, f64, f64, f64),
    /// Output pixels per source pixel the most demanding view needs (a
    /// DCT-scaled decode must keep at least this many).
    pub scale_needed: f64,
}

impl Views {
    /// Checks each group and the bounds, naming the request field.
    pub fn validate(&self) -> Result<(), AugmentError> {
        if self.groups.is_empty() {
            return Err(invalid(
                "views",
                "no view groups: ask at least one group of at least one view".into(),
            ));
        }
        if self.groups.len() > MAX_VIEW_GROUPS {
            return Err(invalid(
                "views",
                format!(
                    "{} groups; at most {MAX_VIEW_GROUPS} are served",
                    self.groups.len()
                ),
            ));
        }
        for (g, group) in self.groups.iter().enumerate() {
            let count = group.count();
            if count == 0 || count > MAX_VIEWS_PER_GROUP as usize {
                return Err(invalid(
                    "views.count",
                    format!(
                        "group {g}: {count} views; each group takes 1 to {MAX_VIEWS_PER_GROUP}"
                    ),
                ));
            }
            let (h, w) = group.size();
            if h == 0 || w == 0 || h > MAX_SIZE || w > MAX_SIZE {
                return Err(invalid(
                    "views.size",
                    format!("group {g}: {h}x{w}; each side must be 1 to {MAX_SIZE}"),
                ));
            }
            for (v, spec) in group.views.iter().enumerate() {
                if (spec.height, spec.width) != (h, w) {
                    return Err(invalid(
                        "views.size",
                        format!(
                            "group {g}: view {v} is {}x{}, the group's first {h}x{w}; a \
                             group is one array, so its views share one size",
                            spec.height, spec.width
                        ),
                    ));
                }
                spec.validate().map_err(|e| AugmentError {
                    message: format!("in view group {g}, view {v}: {}", e.message),
                    ..e
                })?;
            }
        }
        let bytes = self.bytes_per_sample();
        if bytes > MAX_VIEW_BYTES_PER_SAMPLE {
            return Err(invalid(
                "views",
                format!(
                    "a sample's views hold {bytes} bytes; at most \
                     {MAX_VIEW_BYTES_PER_SAMPLE} are served (fewer or smaller views)"
                ),
            ));
        }
        Ok(())
    }

    /// Output bytes of one sample's views, all groups.
    pub fn bytes_per_sample(&self) -> usize {
        self.specs().map(OutputSpec::bytes).sum()
    }

    /// Every view's spec, group by group.
    pub fn specs(&self) -> impl Iterator<Item = &OutputSpec> {
        self.groups.iter().flat_map(|g| &g.views)
    }

    /// Views per sample, all groups.
    pub fn count(&self) -> usize {
        self.groups.iter().map(ViewGroup::count).sum()
    }

    /// Whether any view's decisions make the sample the server's to decode
    /// when delivered encoded ([`OutputSpec::decoded_by_server_alone`], each
    /// view with its own key).
    pub fn decoded_by_server_alone(&self, key: &SampleKey) -> bool {
        self.groups.iter().enumerate().any(|(g, group)| {
            group
                .views
                .iter()
                .enumerate()
                .any(|(v, spec)| spec.decoded_by_server_alone(&view_key(key, g as u32, v as u32)))
        })
    }

    /// Whether a client that decodes, naming `client_ops`, makes every
    /// view's pixels (else the server decodes every sample).
    pub fn client_replays(&self, client_ops: &[String]) -> bool {
        self.specs().all(|spec| spec.client_replays(client_ops))
    }

    /// Every view's box and decisions for one sample of a `width x height`
    /// image, and the region decoded for them.
    pub fn plan(&self, width: u32, height: u32, key: &SampleKey) -> ViewsPlan {
        let mut boxes = Vec::with_capacity(self.count());
        let mut region = (f64::INFINITY, f64::INFINITY, 0.0f64, 0.0f64);
        let mut scale_needed = 0.0f64;
        for (g, group) in self.groups.iter().enumerate() {
            for (v, spec) in group.views.iter().enumerate() {
                let crop = spec.crop_box(width, height, &view_key(key, g as u32, v as u32));
                region.0 = region.0.min(crop.left);
                region.1 = region.1.min(crop.top);
                region.2 = region.2.max(crop.left + crop.width);
                region.3 = region.3.max(crop.top + crop.height);
                let need =
                    (f64::from(spec.width) / crop.width).max(f64::from(spec.height) / crop.height);
                scale_needed = scale_needed.max(need);
                boxes.push(crop);
            }
        }
        ViewsPlan {
            boxes,
            region,
            scale_needed,
        }
    }
}

/// The key view `view` of group `group` draws from: the sample's, its
/// identity re-keyed by the pair (see the module's notes).
pub fn view_key(key: &SampleKey, group: u32, view: u32) -> SampleKey {
    let sample =
        Rng::derive(&[PURPOSE_VIEW, key.sample, u64::from(group), u64::from(view)]).next_u64();
    SampleKey { sample, ..*key }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::augment::{Crop, HorizontalFlip, Ops, RandomResizedCrop, Resample};

    fn group(count: u32, side: u32, scale: (f64, f64)) -> ViewGroup {
        ViewGroup::repeated(
            count,
            OutputSpec {
                height: side,
                width: side,
                crop: Crop::RandomResized(RandomResizedCrop {
                    scale,
                    ..RandomResizedCrop::default()
                }),
                resample: Resample::Bicubic,
                ops: Ops {
                    horizontal_flip: HorizontalFlip(0.5),
                    ..Ops::NONE
                },
            },
        )
    }

    /// DINOv2's two groups: 2 global crops at 224², 8 local ones at 96².
    fn dino() -> Views {
        Views {
            groups: vec![group(2, 224, (0.32, 1.0)), group(8, 96, (0.05, 0.32))],
        }
    }

    fn key(sample: u64, copy: u32) -> SampleKey {
        SampleKey {
            seed: 7,
            epoch: 1,
            sample,
            copy,
        }
    }

    fn centre(b: &CropBox) -> f64 {
        b.left + b.width / 2.0
    }

    fn correlation(xs: &[f64], ys: &[f64]) -> f64 {
        let n = xs.len() as f64;
        let (mx, my) = (xs.iter().sum::<f64>() / n, ys.iter().sum::<f64>() / n);
        let cov: f64 = xs.iter().zip(ys).map(|(x, y)| (x - mx) * (y - my)).sum();
        let vx: f64 = xs.iter().map(|x| (x - mx).powi(2)).sum();
        let vy: f64 = ys.iter().map(|y| (y - my).powi(2)).sum();
        cov / (vx * vy).sqrt()
    }

    /// Over 20,000 samples, a global and a local view's flips agree half
    /// the time and their centres are uncorrelated, as are two views of one
    /// group (two streams zipped by key agree 77% and correlate at 0.63-0.73).
    #[test]
    fn views_draw_independently_of_each_other() {
        let views = dino();
        let (mut agree_gl, mut agree_gg) = (0usize, 0usize);
        let (mut g0, mut g1, mut l0) = (Vec::new(), Vec::new(), Vec::new());
        let n = 20_000;
        for sample in 0..n {
            let plan = views.plan(500, 375, &key(sample, 0));
            let [a, b, c] = [&plan.boxes[0], &plan.boxes[1], &plan.boxes[2]];
            agree_gl += usize::from(a.drawn.horizontal_flip == c.drawn.horizontal_flip);
            agree_gg += usize::from(a.drawn.horizontal_flip == b.drawn.horizontal_flip);
            g0.push(centre(a));
            g1.push(centre(b));
            l0.push(centre(c));
        }
        for agree in [agree_gl, agree_gg] {
            let share = agree as f64 / n as f64;
            assert!((share - 0.5).abs() < 0.02, "flips agree {share}");
        }
        for r in [correlation(&g0, &l0), correlation(&g0, &g1)] {
            assert!(r.abs() < 0.03, "centres correlate at {r}");
        }
    }

    /// A view's decisions are a function of (seed, epoch, sample, copy,
    /// group, view): the same key gives the same plan; another copy,
    /// epoch or sample another.
    #[test]
    fn a_plan_is_a_function_of_the_sample_and_nothing_else() {
        let views = dino();
        let plan = views.plan(640, 480, &key(3, 0));
        assert_eq!(plan, views.plan(640, 480, &key(3, 0)));
        assert_eq!(plan.boxes.len(), 10);
        for other in [
            key(3, 1),
            key(4, 0),
            SampleKey {
                epoch: 2,
                ..key(3, 0)
            },
        ] {
            assert_ne!(plan.boxes, views.plan(640, 480, &other).boxes);
        }
        // The group's place in the request keys it: a group of one view
        // alone draws what the first view of that group draws.
        let local = Views {
            groups: vec![group(8, 96, (0.05, 0.32))],
        };
        assert_ne!(local.plan(640, 480, &key(3, 0)).boxes[0], plan.boxes[2]);
        assert_eq!(local.plan(640, 480, &key(3, 0)).boxes[0], {
            let k = view_key(&key(3, 0), 0, 0);
            local.groups[0].views[0].crop_box(640, 480, &k)
        });
    }

    /// The region covers every box and lies in the image; the scale kept
    /// is what the most demanding view needs.
    #[test]
    fn the_region_covers_every_view_at_the_scale_the_largest_needs() {
        let views = dino();
        for sample in 0..2_000 {
            let plan = views.plan(800, 600, &key(sample, 0));
            let (l, t, r, b) = plan.region;
            assert!(l >= 0.0 && t >= 0.0 && r <= 800.0 && b <= 600.0);
            let mut most = 0.0f64;
            for (i, bx) in plan.boxes.iter().enumerate() {
                assert!(bx.left >= l && bx.top >= t);
                assert!(bx.left + bx.width <= r && bx.top + bx.height <= b);
                let side = if i < 2 { 224.0 } else { 96.0 };
                most = most.max((side / bx.width).max(side / bx.height));
            }
            assert_eq!(plan.scale_needed, most);
        }
    }

    #[test]
    fn bad_groups_are_refused_naming_the_field() {
        let field = |views: Views| views.validate().unwrap_err().field;
        assert_eq!(field(Views::default()), "views");
        assert_eq!(
            field(Views {
                groups: vec![group(0, 96, (0.05, 0.32))]
            }),
            "views.count"
        );
        assert_eq!(
            field(Views {
                groups: vec![group(2, 224, (0.3, 1.0)), group(33, 96, (0.05, 0.3))]
            }),
            "views.count"
        );
        assert_eq!(
            field(Views {
                groups: vec![group(2, 224, (0.3, 1.0)), group(2, 4097, (0.05, 0.3))]
            }),
            "views.size"
        );
        assert_eq!(
            field(Views {
                groups: vec![group(32, 4096, (0.3, 1.0))]
            }),
            "views"
        );
        assert_eq!(
            field(Views {
                groups: vec![group(2, 224, (0.0, 1.0))]
            }),
            "augmentation.random_resized_crop.scale"
        );
        let error = Views {
            groups: vec![group(2, 224, (0.3, 1.0)), group(33, 96, (0.05, 0.3))],
        }
        .validate()
        .unwrap_err();
        assert!(error.message.starts_with("group 1: 33 views"), "{error}");
        let mut mixed = group(2, 224, (0.3, 1.0));
        mixed.views[1].width = 200;
        assert_eq!(
            field(Views {
                groups: vec![mixed]
            }),
            "views.size"
        );
        assert!(dino().validate().is_ok());
        assert_eq!(
            dino().bytes_per_sample(),
            2 * 224 * 224 * 3 + 8 * 96 * 96 * 3
        );
    }
}
