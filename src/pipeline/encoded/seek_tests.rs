//! The search against curves of rate by share: this machine's shared CPU,
//! separate cores, a GPU that decodes and trains, and a loop whose model
//! caps the rate.

use super::*;

/// Runs `batches` through a seeker whose client takes a batch at the
/// rate `curve(share)` gives for the share it was placed with, with
/// `lag` batches between placement and the client (a full ring), and
/// `noise` (± that fraction, deterministic) on each batch's time.
/// Returns the shares placed and the mean rate over the last half.
fn run(
    curve: impl Fn(f64) -> f64,
    start: Option<f64>,
    batches: usize,
    noise: f64,
) -> (RateSeeker, Vec<f64>, f64) {
    run_from(RateSeeker::new(start), curve, batches, noise)
}

/// [`run`] from a given seeker.
fn run_from(
    seeker: RateSeeker,
    curve: impl Fn(f64) -> f64,
    batches: usize,
    noise: f64,
) -> (RateSeeker, Vec<f64>, f64) {
    run_bursts(seeker, curve, batches, noise, 1)
}

/// [`run_from`] with each noise draw held for `burst` batches: a pause
/// of the client's (its collector, a report) slows several in a row, so
/// whole windows come out fast or slow.
fn run_bursts(
    mut seeker: RateSeeker,
    curve: impl Fn(f64) -> f64,
    batches: usize,
    noise: f64,
    burst: usize,
) -> (RateSeeker, Vec<f64>, f64) {
    let lag = 7;
    let mut placed = std::collections::VecDeque::new();
    let mut shares = Vec::new();
    let (mut late_samples, mut late_seconds) = (0.0, 0.0);
    let mut jitter = 0x9e37_79b9_u32;
    let mut drawn = 1.0;
    for batch in 0..batches {
        placed.push_back(seeker.share());
        shares.push(seeker.share());
        if placed.len() <= lag {
            continue;
        }
        let taken = placed.pop_front().unwrap();
        if batch % burst == 0 {
            drawn = wobble(&mut jitter, noise);
        }
        let seconds = 128.0 / curve(taken) * drawn;
        if batch >= batches / 2 {
            late_samples += 128.0;
            late_seconds += seconds;
        }
        seeker.handed(128, Duration::from_secs_f64(seconds), lag, None);
    }
    (seeker, shares, late_samples / late_seconds)
}

/// A batch's time factor, 1 ± `noise`, from a xorshift of `jitter`
/// (deterministic).
fn wobble(jitter: &mut u32, noise: f64) -> f64 {
    *jitter ^= *jitter << 13;
    *jitter ^= *jitter >> 17;
    *jitter ^= *jitter << 5;
    1.0 + noise * (2.0 * f64::from(*jitter) / f64::from(u32::MAX) - 1.0)
}

/// This machine's CPU-shared curve (docs/benchmarks.md): the trainer's
/// decode is dearer, so the more the server decodes the better.
fn shared_cpu(share: f64) -> f64 {
    1.0 / (share / 1400.0 + (1.0 - share) / 320.0)
}

/// Separate cores: the slower side sets the rate, best where the two
/// finish together (at 0.8 here).
fn separate_cores(share: f64) -> f64 {
    let server = 660.0 / share.max(1e-6);
    let client = 165.0 / (1.0 - share).max(1e-6);
    server.min(client)
}

/// A trainer's GPU that decodes and trains: each sample the GPU
/// decodes adds to the step (an H200's ResNet-50 figures), the sidecar
/// on 8 cores caps the rate. Gentle: 1.4% a sixteenth of the share.
fn shared_gpu(share: f64) -> f64 {
    let client = 1.0 / (1.0 / 4321.0 + (1.0 - share) * 70e-6);
    client.min(4200.0 / share.max(1e-6))
}

#[test]
fn it_climbs_a_gentle_slope_from_a_fine_start() {
    let best = shared_gpu(0.9);
    let (seeker, _, late) = run(shared_gpu, Some(0.0), 600, 0.02);
    assert!(seeker.state().center >= 0.75, "{}", seeker.state().center);
    assert!(late > 0.95 * best, "{late} vs {best}");
}

#[test]
fn short_streams_chained_through_their_state_search_as_one_long_one() {
    // Epochs of 60 batches: restarting from the settled share alone,
    // each stream holds 32 batches before probing and the search
    // never leaves its start; going on from the last state, it climbs.
    let best = shared_gpu(0.9);
    let mut state: Option<SearchState> = None;
    let mut start = Some(0.0);
    let mut late = 0.0;
    for epoch in 0..12 {
        let seeker = match state {
            Some(state) => RateSeeker::resume(state),
            None => RateSeeker::new(start),
        };
        let (seeker, _, rate) = run_from(seeker, shared_gpu, 60, 0.02);
        assert!(seeker.state().invalid().is_none(), "{:?}", seeker.state());
        state = Some(seeker.state());
        start = Some(seeker.state().center);
        if epoch == 11 {
            late = rate;
        }
    }
    let state = state.unwrap();
    assert!(state.center >= 0.75, "{state:?}");
    assert!(late > 0.93 * best, "{late} vs {best}");
    // From the settled share alone, the same epochs stay near 0.
    let mut start = Some(0.0);
    for _ in 0..12 {
        let (seeker, _, _) = run_from(RateSeeker::new(start), shared_gpu, 60, 0.02);
        start = Some(seeker.state().center);
    }
    assert!(start.unwrap() < 0.5, "{start:?}");
}

#[test]
fn a_state_out_of_range_is_named() {
    let good = SearchState {
        center: 0.5,
        step: MIN_STEP,
        hold: 0,
        next_hold: FIRST_HOLD,
        loop_id: 0,
        noise: None,
    };
    assert_eq!(good.invalid(), None);
    for (bad, what) in [
        (
            SearchState {
                center: 1.5,
                ..good
            },
            "center",
        ),
        (SearchState { step: 0.0, ..good }, "step"),
        (
            SearchState {
                hold: 10_000,
                ..good
            },
            "hold",
        ),
        (
            SearchState {
                next_hold: 0,
                ..good
            },
            "next_hold",
        ),
        (
            SearchState {
                noise: Some(f64::NAN),
                ..good
            },
            "noise",
        ),
    ] {
        assert!(bad.invalid().unwrap().starts_with(what), "{bad:?}");
    }
}

#[test]
fn it_climbs_to_the_end_the_rate_rises_towards() {
    let (seeker, _, late) = run(shared_cpu, None, 400, 0.05);
    assert_eq!(seeker.state().center, 1.0);
    assert!(late > 0.95 * shared_cpu(1.0), "{late}");
}

#[test]
fn it_finds_an_interior_best_where_the_sides_balance() {
    let (seeker, _, late) = run(separate_cores, None, 600, 0.05);
    let best = separate_cores(0.8);
    assert!(
        (seeker.state().center - 0.8).abs() <= MIN_STEP + 1e-9,
        "{}",
        seeker.state().center
    );
    assert!(late > 0.9 * best, "{late} vs {best}");
}

#[test]
fn a_settled_start_probes_rarely() {
    let (seeker, shares, late) = run(shared_cpu, Some(1.0), 1000, 0.05);
    assert_eq!(seeker.state().center, 1.0);
    // Five probes (after 32, 64, ... 512 batches held), each 13
    // batches placed at 15/16: the window and the batches in flight.
    let away = shares.iter().filter(|&&s| s != 1.0).count();
    assert!(away <= 5 * 13, "{away} of 1000 batches away from the best");
    assert!(late > 0.97 * shared_cpu(1.0), "{late}");
}

#[test]
fn windows_far_noisier_than_the_margin_move_nothing_the_noise_made() {
    // This machine's CPU trainer: windows of one share came out 20-40%
    // apart. Settled at the best end, the search probes a step in and
    // comes back; it neither moves nor leaps a quarter in.
    let (seeker, shares, late) = run_bursts(RateSeeker::new(Some(1.0)), shared_cpu, 1000, 0.2, 4);
    assert_eq!(seeker.state().center, 1.0);
    let lowest = shares.iter().copied().fold(1.0, f64::min);
    let away = shares.iter().filter(|&&s| s != 1.0).count();
    let noise = seeker.state().noise.unwrap();
    println!(
        "noise 20% in bursts of 4: {away} of 1000 batches away from 1.0, lowest share \
         {lowest}, measured noise {noise:.3}, late rate {late:.0} of {:.0}",
        shared_cpu(1.0)
    );
    assert!(lowest >= 1.0 - MIN_STEP, "{lowest}");
    // Five probes, each the shortest window (a clear loss ends there,
    // though noisy windows are longer) and the batches in flight behind it.
    assert!(window_batches(Some(noise)) > WINDOW_BATCHES);
    assert!(away <= 5 * (WINDOW_BATCHES as usize + 7), "{away}");
    assert!(noise > 0.03, "{noise}");
}

#[test]
fn a_flat_curve_under_noise_stays_near_the_start() {
    let (seeker, _, _) = run(|_| 1000.0, Some(0.5), 1000, 0.02);
    assert!((seeker.state().center - 0.5).abs() <= 2.0 * MIN_STEP);
}

#[test]
fn a_far_start_closes_in_within_a_few_hundred_batches() {
    let (seeker, _, late) = run(shared_cpu, Some(0.0), 400, 0.05);
    assert_eq!(seeker.state().center, 1.0);
    assert!(late > 0.95 * shared_cpu(1.0), "{late}");
    let (seeker, _, _) = run(separate_cores, Some(0.0), 400, 0.05);
    assert!((seeker.state().center - 0.8).abs() <= MIN_STEP + 1e-9);
}

/// A trainer that decodes on its own device, ahead of its loop, with
/// the sidecar decoding `share` of each batch: the supply of samples
/// a second, capped by the sidecar's capacity and the device's.
fn supply(share: f64) -> f64 {
    (660.0 / share.max(1e-6)).min(1000.0 / (1.0 - share).max(1e-6))
}

struct LoopRun {
    seeker: RateSeeker,
    /// The search's center after each batch.
    centers: Vec<f64>,
    /// (share placed, the loop's waiting share) per batch taken.
    taken: Vec<(f64, f64)>,
}

/// Runs a loop whose model takes `model(batch)` samples a second at
/// most: each batch's step is its work and, where the supply at the
/// batch's share is short of the model, a wait. The client reports its
/// loop's totals every other batch, as the client does.
fn run_loop(
    mut seeker: RateSeeker,
    model: impl Fn(usize) -> f64,
    batches: usize,
    noise: f64,
) -> LoopRun {
    let lag = 7;
    let mut placed = std::collections::VecDeque::new();
    let (mut taken, mut centers) = (Vec::new(), Vec::new());
    let (mut waited, mut stepped) = (0.0, 0.0);
    let mut reported = None;
    let mut jitter = 0x2545_f491_u32;
    for batch in 0..batches {
        placed.push_back(seeker.share());
        centers.push(seeker.state().center);
        if placed.len() <= lag {
            continue;
        }
        let share = placed.pop_front().unwrap();
        let wobble = wobble(&mut jitter, noise);
        let work = 128.0 / model(batch);
        let step = (128.0 / supply(share)).max(work) * wobble;
        let wait = (step - work).max(0.0);
        waited += wait;
        stepped += step;
        taken.push((share, wait / step));
        if batch % 2 == 0 {
            reported = Some(LoopTotals {
                waited,
                stepped,
                steps: taken.len() as u64,
            });
        }
        seeker.handed(128, Duration::from_secs_f64(step), lag, reported);
    }
    LoopRun {
        seeker,
        centers,
        taken,
    }
}

fn late_waiting(run: &LoopRun) -> f64 {
    let late = &run.taken[run.taken.len() / 2..];
    late.iter().map(|(_, waiting)| waiting).sum::<f64>() / late.len() as f64
}

#[test]
fn a_fed_loop_raises_the_share_to_the_sidecars_capacity() {
    // A slow model (300 samples/s): the sidecar alone feeds it, so
    // the search spares the trainer's device entirely.
    let slow = run_loop(RateSeeker::new(None), |_| 300.0, 600, 0.02);
    assert_eq!(slow.seeker.state().center, 1.0);
    assert!(late_waiting(&slow) <= LOOP_FED, "{}", late_waiting(&slow));
    // By the rate alone every share here gives 300/s: it would stay.
    let (blind, _, _) = run(|share| supply(share).min(300.0), None, 600, 0.02);
    assert!(blind.state().center < 1.0, "{:?}", blind.state());
}

#[test]
fn a_fast_loop_lowers_the_share_until_it_is_fed() {
    // 800 samples/s: the sidecar feeds it up to 660/0.825.
    let run = run_loop(RateSeeker::new(Some(1.0)), |_| 800.0, 800, 0.02);
    let center = run.seeker.state().center;
    assert!((0.6875..=0.8125).contains(&center), "{center}");
    assert!(
        late_waiting(&run) <= 2.0 * LOOP_FED,
        "{}",
        late_waiting(&run)
    );
}

#[test]
fn the_share_follows_a_model_whose_step_changes() {
    // Slow for 600 batches (settles at 1.0), then fast: the loop
    // starts to wait, and the held search starts again.
    let change = 600;
    let model = |batch: usize| if batch < change { 300.0 } else { 800.0 };
    let run = run_loop(RateSeeker::new(None), model, 1400, 0.02);
    assert_eq!(run.centers[change - 1], 1.0);
    let center = run.seeker.state().center;
    assert!((0.6875..=0.8125).contains(&center), "{center}");
    // The center moves to a share that feeds the loop within this many
    // batches of the change (the watch's window, a window at 1.0 and
    // one a step down, each behind the batches in flight), and stays
    // at one while the search settles.
    let fed = |share: f64| share <= 0.8125 + 1e-9;
    let followed = (change..run.centers.len())
        .find(|&batch| fed(run.centers[batch]))
        .unwrap();
    println!(
        "model 300 -> 800 samples/s at batch {change}: center fed {} batches later, \
         settled at {center}",
        followed - change
    );
    assert!(followed - change <= 80, "{} batches", followed - change);
    assert!(run.centers[followed..].iter().all(|&c| fed(c)));
}

#[test]
fn shares_stay_within_bounds() {
    for start in [None, Some(0.0), Some(1.0), Some(0.97)] {
        let (_, shares, _) = run(shared_cpu, start, 300, 0.1);
        assert!(shares.iter().all(|s| (0.0..=1.0).contains(s)));
    }
}
