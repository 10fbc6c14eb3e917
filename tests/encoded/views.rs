//! Views delivered encoded: a sample the client decodes arrives once,
//! compressed, in the place of its widest group's first view, with every
//! view's box and decisions those of the decoded delivery; a sample the
//! server decodes has every view's pixels as the decoded delivery's; a
//! substitute carries its source's bytes and boxes. The batch is as long
//! as a decoded one.

use super::common::*;
use super::{encoded, originals, photos};
use shardfeed::server::pb;

/// SimCLR-like global views and DINO-like local ones, each with a flip
/// and colour ops, the globals bicubic.
fn views_request(dataset: &str) -> pb::StreamBatchesRequest {
    let crop = random_resized;
    let jitter = Some(pb::ColorJitter {
        brightness: Some(pb::Range { min: 0.6, max: 1.4 }),
        hue: Some(pb::Range {
            min: -0.1,
            max: 0.1,
        }),
        p: Some(0.8),
        ..Default::default()
    });
    let global = pb::Augmentation {
        crop: crop(0.32, 1.0),
        horizontal_flip: 0.5,
        color_jitter: jitter,
        grayscale: 0.2,
        resize_interpolation: Some(pb::Interpolation::Bicubic as i32),
        ..Default::default()
    };
    pb::StreamBatchesRequest {
        batch_size: Some(6),
        seed: 5,
        height: 0,
        width: 0,
        views: vec![
            pb::ViewGroup {
                height: 16,
                width: 16,
                views: vec![pb::Augmentation {
                    crop: crop(0.05, 0.32),
                    horizontal_flip: 0.5,
                    ..Default::default()
                }],
                count: 3,
            },
            pb::ViewGroup {
                height: 64,
                width: 64,
                views: vec![global],
                count: 2,
            },
        ],
        ..request(dataset)
    }
}

/// Every view of `slot`, group by group, view by view: its box and
/// decisions, and its pixels.
fn sample_views(batch: &pb::Batch, slot: usize) -> Vec<(String, Vec<u8>)> {
    let samples = batch.keys.len();
    batch
        .views
        .iter()
        .flat_map(|group| {
            let rows = group.shape.as_ref().unwrap().n as usize;
            let bytes = group.length as usize / rows;
            (0..rows / samples).map(move |view| {
                let row = view * samples + slot;
                let at = group.offset as usize + row * bytes;
                (
                    format!("{:?}", group.crops[row]),
                    batch.images[at..at + bytes].to_vec(),
                )
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn views_arrive_compressed_once_with_every_views_decisions() {
    let harness = Harness::start(Options::default()).await;
    let shards = photos();
    let uri = upload(&harness.s3, "encoded-views", "photos/", &shards).await;
    let originals = originals(&shards);
    let mut client = harness.client().await;
    let decoded = collect(&mut client, views_request(&uri)).await.unwrap();
    // The bicubic resize and the colour ops named, as the Python client
    // names them: the samples are the client's to decode.
    let named = |request: pb::StreamBatchesRequest| pb::StreamBatchesRequest {
        client_ops: ["color_jitter", "grayscale", "resize_bicubic"]
            .map(String::from)
            .to_vec(),
        ..request
    };
    let sent = collect(&mut client, named(encoded(views_request(&uri), Some(0.5))))
        .await
        .unwrap();
    assert_eq!(decoded.len(), sent.len());
    // The widest group's first view: 64 x 64 x 3 in the second group.
    let (place_bytes, group_offset) = (64 * 64 * 3, 6 * 3 * 16 * 16 * 3);
    let (mut compressed, mut by_server) = (0, 0);
    for (want, got) in decoded.iter().zip(&sent) {
        assert_eq!(got.images.len(), want.images.len(), "as long as decoded");
        assert_eq!((&got.keys, &got.labels), (&want.keys, &want.labels));
        assert_eq!(
            (&got.substituted, &got.substitute_sources),
            (&want.substituted, &want.substitute_sources)
        );
        assert_eq!(got.encoded.len(), got.keys.len());
        for (slot, placed) in got.encoded.iter().enumerate() {
            let (boxes, pixels): (Vec<_>, Vec<_>) = sample_views(got, slot).into_iter().unzip();
            let (want_boxes, want_pixels): (Vec<_>, Vec<_>) =
                sample_views(want, slot).into_iter().unzip();
            assert_eq!(
                boxes, want_boxes,
                "{}: every view's decisions",
                got.keys[slot]
            );
            let own_place = group_offset + slot * place_bytes;
            if placed.decoded {
                by_server += 1;
                assert_eq!(placed.form(), pb::SampleForm::Pixels);
                assert_eq!(pixels, want_pixels, "{}", got.keys[slot]);
                assert_eq!(
                    (placed.offset as usize, placed.length as usize),
                    (own_place, place_bytes)
                );
                continue;
            }
            compressed += 1;
            assert_eq!(placed.form(), pb::SampleForm::Jpeg);
            let at = placed.offset as usize;
            let bytes = &got.images[at..at + placed.length as usize];
            // A substitute points at its source's bytes.
            let source = got
                .substituted
                .iter()
                .position(|&s| s as usize == slot)
                .map(|at| got.substitute_sources[at] as usize);
            let owner = source.unwrap_or(slot);
            assert_eq!(at, group_offset + owner * place_bytes);
            assert_eq!(
                bytes,
                &originals[&got.keys[owner]][..],
                "{}",
                got.keys[slot]
            );
        }
    }
    // 34 samples a client could take (of 36: a PNG, one undecodable), about
    // half of them the server's at share 0.5.
    assert!((8..=26).contains(&compressed), "{compressed} compressed");
    assert!(by_server >= 10, "{by_server} decoded by the server");

    // A view whose resize the client does not name: every sample the
    // server's, its views the decoded delivery's, still an encoded batch.
    let unnamed = collect(&mut client, encoded(views_request(&uri), Some(0.0)))
        .await
        .unwrap();
    for (want, got) in decoded.iter().zip(&unnamed) {
        assert!(got.encoded.iter().all(|placed| placed.decoded));
        assert_eq!(got.images, want.images);
    }
}
