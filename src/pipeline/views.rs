//! A batch of several views per sample: where each view of each sample
//! lies in the batch's bytes, and the batch decoded there, each sample
//! once for all its views.
//!
//! The bytes hold the groups one after another, each group one array
//! `[views × batch, height, width, 3]`, view-major: rows `v*B .. v*B+B`
//! are view `v` of every sample, as DINO's collate stacks its crops (a
//! model's forward pass per resolution takes the group whole; one view of
//! every sample is a contiguous slice). Each view is written once, in its
//! place, by the thread that decoded its sample.
//!
//! Delivered encoded, a sample the client decodes is sent compressed in
//! the place of one of its views (the first of the group with the largest
//! views, [`ViewLayout::widest`]), with every view's box and decisions
//! planned from its header; the client decodes it once and fills every
//! view's place. The batch is as long as a decoded one.

use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;
use tokio::sync::oneshot;

use super::batch::{BatchImages, DecodedBatch};
use super::buffers::BufferPool;
use super::context::StreamCommon;
use super::encoded::{self, BatchShare, ClientSlot, Placement};
use super::sample::EmittedSample;
use super::{remote, shm};
use crate::decode::{self, CropBox, Views};
use crate::metrics;
use crate::pool::wire::{SampleAnswer, UnitOutput};

/// One group's place in a batch's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupPlace {
    pub offset: usize,
    pub views: usize,
    pub view_bytes: usize,
}

impl GroupPlace {
    pub fn length(&self, batch: usize) -> usize {
        self.views * batch * self.view_bytes
    }
}

/// Where every view of every sample of a `batch`-sample batch lies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewLayout {
    pub batch: usize,
    pub groups: Vec<GroupPlace>,
}

impl ViewLayout {
    pub fn new(views: &Views, batch: usize) -> Self {
        let mut offset = 0;
        let groups = views
            .groups
            .iter()
            .map(|group| {
                let place = GroupPlace {
                    offset,
                    views: group.views.len(),
                    view_bytes: group.views.first().map_or(0, decode::OutputSpec::bytes),
                };
                offset += place.length(batch);
                place
            })
            .collect();
        Self { batch, groups }
    }

    /// The view whose place holds a sample sent compressed, by its index in
    /// [`Views::specs`]' order: the first view of the first group whose
    /// views are the largest (a compressed image rarely outgrows it).
    pub fn widest(&self) -> (usize, usize) {
        let mut best = (0, 0);
        let mut index = 0;
        for group in &self.groups {
            if group.views > 0 && group.view_bytes > best.1 {
                best = (index, group.view_bytes);
            }
            index += group.views;
        }
        best
    }

    /// Bytes of one sample's views.
    pub fn sample_bytes(&self) -> usize {
        self.groups.iter().map(|g| g.views * g.view_bytes).sum()
    }

    /// The batch's bytes.
    pub fn length(&self) -> usize {
        self.groups.iter().map(|g| g.length(self.batch)).sum()
    }

    /// Each view's byte range of `sample`, group by group, view by view
    /// (the order of [`Views::specs`]).
    pub fn ranges(&self, sample: usize) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
        self.groups.iter().flat_map(move |group| {
            (0..group.views).map(move |view| {
                let start = group.offset + (view * self.batch + sample) * group.view_bytes;
                start..start + group.view_bytes
            })
        })
    }

    /// The batch's bytes cut into each sample's view outputs, sample by
    /// sample, each sample's in the order of [`Views::specs`].
    pub fn split<'b>(&self, mut images: &'b mut [u8]) -> Vec<Vec<&'b mut [u8]>> {
        let mut samples: Vec<Vec<&mut [u8]>> = (0..self.batch)
            .map(|_| Vec::with_capacity(self.groups.iter().map(|g| g.views).sum()))
            .collect();
        for group in &self.groups {
            let (region, rest) = std::mem::take(&mut images).split_at_mut(group.length(self.batch));
            images = rest;
            if group.view_bytes == 0 {
                continue;
            }
            for (row, out) in region.chunks_exact_mut(group.view_bytes).enumerate() {
                samples[row % self.batch].push(out);
            }
        }
        samples
    }

    /// Puts sample `from`'s views in place of the failed sample `to`'s
    /// (zeros when None). Delivered encoded (`placements` not empty), a
    /// `from` sent compressed is shared instead: `to` points at its bytes
    /// and its own places are zeroed.
    fn copy_placed(
        &self,
        images: &mut [u8],
        placements: &mut [Placement],
        to: usize,
        from: Option<usize>,
    ) {
        match from.and_then(|from| placements.get(from).copied()) {
            Some(source) if !source.decoded() => {
                self.copy_sample(images, to, None);
                placements[to] = source;
            }
            _ => self.copy_sample(images, to, from),
        }
    }

    /// Puts sample `from`'s views in place of `to`'s (zeros when None).
    pub fn copy_sample(&self, images: &mut [u8], to: usize, from: Option<usize>) {
        let targets: Vec<_> = self.ranges(to).collect();
        match from {
            Some(from) => {
                for (target, source) in targets.into_iter().zip(self.ranges(from)) {
                    images.copy_within(source, target.start);
                }
            }
            None => targets
                .into_iter()
                .for_each(|target| images[target].fill(0)),
        }
    }
}

type ViewsOutcome = Result<Vec<CropBox>, (&'static str, String)>;

/// A sample the client decodes: its bytes in its mode's form at the start
/// of `out` (its widest view's place), and every view's box and decisions
/// planned from its header, as a decode here would draw them.
fn client_sample(
    views: &Views,
    emitted: &EmittedSample,
    slot: ClientSlot,
    out: &mut [u8],
) -> ViewsOutcome {
    let (_, data) = emitted.image()?;
    slot.mode.fill(data, &mut out[..slot.sample.length]);
    let (width, height) = (slot.sample.source_width, slot.sample.source_height);
    Ok(views.plan(width, height, &emitted.augment_key()).boxes)
}

/// Decodes one sample once into each of its views' outputs.
fn decode_sample(
    common: &ViewsDecoder,
    emitted: &EmittedSample,
    outs: &mut [&mut [u8]],
) -> ViewsOutcome {
    let (format, data) = emitted.image()?;
    let key = emitted.augment_key();
    match &common.tier {
        None => decode::decode_views_bounded(
            &*common.decoder,
            &common.scratch,
            format,
            data,
            &common.views,
            &key,
            outs,
        )
        .map(|plan| plan.boxes),
        Some(tier) => emitted.with_tier_name(|name| {
            tier.sample_views(
                &*common.decoder,
                &common.scratch,
                format,
                data,
                &common.views,
                &key,
                name,
                outs,
            )
        }),
    }
    .map_err(|e| (e.reason(), e.to_string()))
}

#[derive(Clone)]
struct ViewsDecoder {
    decoder: Arc<dyn decode::Decoder>,
    scratch: Arc<decode::ScratchBudget>,
    views: Arc<Views>,
    /// The decoded-source tier: every view from the one stored source.
    tier: Option<crate::tier::output::TierRequest>,
}

/// A batch of views being decoded: its bytes, and each sample's outcome
/// once it has one (decoded here, or answered by the decode pool).
struct ViewsWork {
    decoder: ViewsDecoder,
    stream_metrics: metrics::StreamMetrics,
    buffers: BufferPool,
    index: u64,
    layout: ViewLayout,
    samples: Vec<EmittedSample>,
    outcomes: Vec<Option<ViewsOutcome>>,
    heap: Vec<u8>,
    lease: Option<shm::SlotLease>,
    /// Samples whose views the pool decoded.
    remote: usize,
    /// Delivered encoded: each sample's placement (empty when decoded).
    placements: Vec<Placement>,
    /// The index, in [`Views::specs`]' order, of the view whose place
    /// holds a compressed sample.
    widest: usize,
}

impl ViewsWork {
    fn new(
        (decoder, stream_metrics, buffers): (ViewsDecoder, metrics::StreamMetrics, BufferPool),
        (index, share): (u64, Option<BatchShare>),
        samples: Vec<EmittedSample>,
        lease: Option<shm::SlotLease>,
    ) -> Self {
        let layout = ViewLayout::new(&decoder.views, samples.len());
        let (widest, place_bytes) = layout.widest();
        let placements = share.map_or_else(Vec::new, |share| {
            let places = (0..samples.len()).map(|slot| {
                let place = layout.ranges(slot).nth(widest);
                place.map_or(0, |range| range.start)
            });
            let limit = decoder.scratch.limit();
            encoded::place_views(&samples, share, &decoder.views, places, place_bytes, limit)
        });
        let heap = match lease {
            Some(_) => Vec::new(),
            None => buffers.take(layout.length()),
        };
        Self {
            decoder,
            stream_metrics,
            buffers,
            index,
            layout,
            outcomes: vec![None; samples.len()],
            samples,
            heap,
            lease,
            remote: 0,
            placements,
            widest,
        }
    }

    fn images(&mut self) -> &mut [u8] {
        images_of(&mut self.heap, &mut self.lease, self.layout.length())
    }
}

impl remote::SplitDecode for ViewsWork {
    /// Decodes every sample with no outcome yet, except those `reserved`
    /// (the pool's), each once, its views straight into their places.
    fn decode_rest(&mut self, reserved: &[bool]) {
        let Self {
            decoder,
            stream_metrics,
            layout,
            samples,
            outcomes,
            heap,
            lease,
            placements,
            widest,
            ..
        } = self;
        let widest = *widest;
        let images = images_of(heap, lease, layout.length());
        let pending: Vec<_> = layout
            .split(images)
            .into_iter()
            .zip(samples.iter())
            .enumerate()
            .filter(|(slot, _)| {
                outcomes[*slot].is_none() && !reserved.get(*slot).copied().unwrap_or(false)
            })
            .collect();
        let decoded: Vec<(usize, ViewsOutcome)> = pending
            .into_par_iter()
            .map(|(slot, (mut outs, emitted))| {
                if let Some(client) = placements.get(slot).and_then(|p| p.client) {
                    let out = &mut *outs[widest];
                    return (slot, client_sample(&decoder.views, emitted, client, out));
                }
                let started = Instant::now();
                let outcome = decode_sample(decoder, emitted, &mut outs);
                stream_metrics.decode_time(started.elapsed().as_secs_f64());
                (slot, outcome)
            })
            .collect();
        for (slot, outcome) in decoded {
            outcomes[slot] = Some(outcome);
        }
    }

    /// Writes each sample the pool decoded into its views' places (the
    /// unit holds a sample's views one after another, in the order of
    /// [`Views::specs`]); one it failed, or a unit it never answered,
    /// stays for local decode.
    fn place_answers(&mut self, answers: Vec<remote::UnitResult>) {
        for (slots, answer) in answers {
            let Some(answer) = answer else {
                continue;
            };
            let sample_bytes = self.layout.sample_bytes();
            for (i, (&slot, sample)) in slots.iter().zip(answer.samples).enumerate() {
                let SampleAnswer::DecodedViews(boxes) = sample else {
                    continue;
                };
                let mut pixels = &answer.pixels[i * sample_bytes..(i + 1) * sample_bytes];
                let images = images_of(&mut self.heap, &mut self.lease, self.layout.length());
                for range in self.layout.ranges(slot) {
                    let (view, rest) = pixels.split_at(range.len());
                    images[range].copy_from_slice(view);
                    pixels = rest;
                }
                self.outcomes[slot] = Some(Ok(boxes));
                self.remote += 1;
            }
        }
    }

    /// The batch, with failures substituted (every view of a failed
    /// sample from the same source) and labels and fields gathered.
    fn finish(mut self) -> DecodedBatch {
        let index = self.index;
        let length = self.layout.length();
        let mut placements = std::mem::take(&mut self.placements);
        if placements.is_empty() {
            crate::metrics::pool::samples(
                (self.samples.len() - self.remote) as u64,
                self.remote as u64,
            );
        }
        let (mut crops, failures): (Vec<Vec<CropBox>>, Vec<_>) = std::mem::take(&mut self.outcomes)
            .into_iter()
            .map(|outcome| {
                match outcome.unwrap_or_else(|| Err(("internal", "sample left undecoded".into()))) {
                    Ok(boxes) => (boxes, None),
                    Err(failure) => (Vec::new(), Some(failure)),
                }
            })
            .unzip();
        let samples = std::mem::take(&mut self.samples);
        let layout = self.layout.clone();
        let images = self.images();
        let mut batch =
            DecodedBatch::settle(index, samples, &failures, &mut crops, |slot, from| {
                layout.copy_placed(images, &mut placements, slot, from)
            });
        batch.view_crops = crops;
        if !placements.is_empty() {
            batch.deliver_placed(placements, &self.stream_metrics);
        }
        batch.image_bytes = length;
        batch.images = match self.lease {
            Some(lease) => BatchImages::Shared(lease),
            None => BatchImages::Inline(self.buffers.share(self.heap).slice(..length)),
        };
        batch
    }
}

fn images_of<'a>(
    heap: &'a mut [u8],
    lease: &'a mut Option<shm::SlotLease>,
    length: usize,
) -> &'a mut [u8] {
    match lease {
        Some(lease) => &mut lease.as_mut_slice()[..length],
        None => &mut heap[..length],
    }
}

/// Decodes a batch of views, each sample once, its views straight into
/// their places (process memory, or the ring slot). With `remote`, the
/// samples it names go to the decode pool first (a unit of views), and
/// only those it does not answer are decoded here. With `share` (an
/// encoded delivery), the samples the client decodes are placed
/// compressed instead.
pub(super) fn decode_batch(
    common: &StreamCommon,
    (views, share): (Arc<Views>, Option<BatchShare>),
    buffers: &BufferPool,
    remote: Option<remote::RemotePart>,
    samples: Vec<EmittedSample>,
    index: u64,
    shared_slot: Option<shm::SlotLease>,
) -> oneshot::Receiver<DecodedBatch> {
    let decoder = ViewsDecoder {
        decoder: common.decoder.clone(),
        scratch: common.scratch.clone(),
        views,
        tier: common.tier.clone(),
    };
    let queued = metrics::GaugeGuard::new(metrics::DECODE_QUEUE, samples.len() as f64);
    // As a batch of one output each: the pool's units ask for the views.
    let remote = remote.map(|part| (part, UnitOutput::Views(decoder.views.clone())));
    let parts = (decoder, common.metrics.clone(), buffers.clone());
    remote::decode_split(
        common.pool.clone(),
        queued,
        remote,
        samples,
        move |samples| ViewsWork::new(parts, (index, share), samples, shared_slot),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{Crop, Ops, OutputSpec, Resample, ViewGroup};

    /// A `side`² center crop without ops.
    fn spec(side: u32) -> OutputSpec {
        OutputSpec {
            height: side,
            width: side,
            crop: Crop::Center { resize: None },
            resample: Resample::Bilinear,
            ops: Ops::NONE,
        }
    }

    fn views() -> Views {
        Views {
            groups: vec![
                ViewGroup::repeated(2, spec(4)),
                ViewGroup::repeated(3, spec(2)),
            ],
        }
    }

    /// The views of a sample are where `ranges` says, view-major in each
    /// group, and `split` hands each sample exactly those bytes.
    #[test]
    fn each_view_lies_view_major_in_its_group() {
        let layout = ViewLayout::new(&views(), 5);
        let global = 4 * 4 * 3;
        let local = 2 * 2 * 3;
        assert_eq!(layout.length(), 5 * (2 * global + 3 * local));
        assert_eq!(layout.groups[1].offset, 5 * 2 * global);
        let ranges: Vec<_> = layout.ranges(3).collect();
        assert_eq!(ranges[0].start, 3 * global);
        assert_eq!(ranges[1].start, (5 + 3) * global);
        assert_eq!(ranges[4].start, 10 * global + (2 * 5 + 3) * local);
        let mut bytes = vec![0u8; layout.length()];
        for (sample, outs) in layout.split(&mut bytes).into_iter().enumerate() {
            assert_eq!(outs.len(), 5);
            for (view, out) in outs.into_iter().enumerate() {
                out.fill((sample * 10 + view + 1) as u8);
            }
        }
        for sample in 0..5 {
            for (view, range) in layout.ranges(sample).enumerate() {
                assert!(bytes[range]
                    .iter()
                    .all(|&b| b == (sample * 10 + view + 1) as u8));
            }
        }
        assert!(bytes.iter().all(|&b| b != 0), "every byte is some view's");
        layout.copy_sample(&mut bytes, 1, Some(4));
        layout.copy_sample(&mut bytes, 2, None);
        for (view, range) in layout.ranges(1).enumerate() {
            assert!(bytes[range].iter().all(|&b| b == (40 + view + 1) as u8));
        }
        assert!(layout
            .ranges(2)
            .all(|range| bytes[range].iter().all(|&b| b == 0)));
    }

    /// A compressed sample goes in the first view of the first group whose
    /// views are the largest, whatever the groups' order.
    #[test]
    fn the_widest_place_is_the_first_of_the_largest_views() {
        let of = |groups: Vec<ViewGroup>| ViewLayout::new(&Views { groups }, 5).widest();
        assert_eq!(of(views().groups), (0, 4 * 4 * 3));
        let local_first = vec![
            ViewGroup::repeated(3, spec(2)),
            ViewGroup::repeated(2, spec(4)),
            ViewGroup::repeated(1, spec(4)),
        ];
        assert_eq!(of(local_first), (3, 4 * 4 * 3));
    }

    /// A failed sample's substitute: a compressed source is shared (the
    /// slot points at its bytes, its own places zeroed); a decoded one has
    /// every view copied, the slot's placement its own.
    #[test]
    fn a_substitute_shares_a_compressed_source_and_copies_a_decoded_one() {
        use crate::pipeline::encoded::{ClientForm, ClientMode, ClientSample, ClientSlot};
        let layout = ViewLayout::new(&views(), 4);
        let mut bytes: Vec<u8> = (0..layout.length()).map(|i| (i % 251 + 1) as u8).collect();
        let place = |slot: usize, client: bool| {
            let range = layout.ranges(slot).next().unwrap();
            Placement {
                offset: range.start,
                length: if client { 10 } else { range.len() },
                client: client.then_some(ClientSlot {
                    mode: ClientMode::BaselineJpeg,
                    sample: ClientSample {
                        form: ClientForm::Jpeg,
                        source_width: 9,
                        source_height: 9,
                        length: 10,
                    },
                }),
            }
        };
        let mut placements = vec![
            place(0, true),
            place(1, false),
            place(2, false),
            place(3, false),
        ];
        let before = bytes.clone();
        layout.copy_placed(&mut bytes, &mut placements, 2, Some(0));
        assert_eq!(placements[2], placements[0], "points at the source's bytes");
        assert!(layout.ranges(2).all(|r| bytes[r].iter().all(|&b| b == 0)));
        layout.copy_placed(&mut bytes, &mut placements, 3, Some(1));
        assert_eq!(placements[3], place(3, false), "its own place");
        for (to, from) in layout.ranges(3).zip(layout.ranges(1)) {
            assert_eq!(bytes[to], before[from]);
        }
    }
}
