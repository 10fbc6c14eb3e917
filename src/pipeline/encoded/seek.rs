//! The tuned server share of an encoded delivery: the share of each batch
//! the server decodes, sought for the rate the client takes batches at
//! (the trainer's step rate), not for balanced decode times.
//!
//! Balancing is right only where the two sides' decode work is
//! independent: a trainer decoding on its own GPU or its own cores. Where
//! trainer and sidecar share the CPU, moving decodes to the slower decoder
//! (a trainer's full-size IDCT costs several times the sidecar's region
//! decode) lowers the rate even though the sidecar is what the trainer
//! waits on. So the share moves only where a measured rate says it pays:
//! a compass search on the rate of batches handed on, which in steady
//! state is the rate the client takes them (the ring and the ready queue
//! hold the producer back to it).
//!
//! Each measurement is a window at one share: first the batches already
//! placed when the share was set are let through (they were placed at the
//! share before), then `WINDOW_BATCHES` are timed. A probe at
//! `center ± step` that beats the center by `MARGIN` becomes the center
//! (and the step doubles, so a far start closes in fast); when neither
//! side does, the step halves, down to `MIN_STEP`; at that
//! step the search holds the center for a doubling number of batches
//! between probes, so a settled stream spends little time at worse shares
//! but still follows a trainer whose pace changes.
//!
//! A gentle slope defeats fine probes: where a trainer's GPU both decodes
//! and trains, each sixteenth of the share the sidecar takes over gains
//! ~1.5%, under the margin, though three quarters gain ~20% (an H200
//! feeding ResNet-50 held share 0 at 0.77x its synthetic rate). So when
//! neither fine probe beat the center by the margin but one beat it at
//! all, the search leaps `FIRST_STEP` that way before it holds.
//!
//! Under a model that caps the rate, every share that keeps the training
//! loop fed gives the same rate. Where the client reports its loop's waits
//! (`loop_waits.rs`), a window also measures the share of the loop's time
//! spent waiting, and the objective follows the loop: a share whose loop
//! waits at most `LOOP_FED` beats one whose loop waits more; of two that
//! both keep it fed, the higher share wins (the trainer's device spared);
//! of two that both leave it waiting, the rate decides as above. So a
//! fed loop's search climbs until the loop would wait, and a waiting
//! loop's search goes where the rate is best. A settled search watches the
//! loop while it holds: when the loop's state leaves the one it settled
//! with by a margin (waiting over `2 LOOP_FED` where it was fed, under
//! `LOOP_FED / 2` where it waited), it searches again, from fine steps.
//! The margin between the thresholds is what keeps it from oscillating.

use std::time::Duration;

use super::loop_waits::LoopTotals;

/// Batches timed at one share. With ~1 ms of jitter on a ~100 ms batch,
/// six of them put a window's rate within a percent or two.
const WINDOW_BATCHES: u32 = 6;
/// A probe must beat the center by this much to replace it: below, the
/// difference is taken for noise.
const MARGIN: f64 = 0.03;
/// The first step without a start from the request, and the largest: the
/// middle's probes reach either end in two moves.
const FIRST_STEP: f64 = 0.25;
/// The finest step: a share within it of the best is within a few percent
/// of the best rate on every curve measured (see docs/benchmarks.md).
pub const MIN_STEP: f64 = 1.0 / 16.0;
/// Batches held at a settled center before probing again, first and most.
const FIRST_HOLD: u32 = 32;
const MAX_HOLD: u32 = 512;
/// A loop that waits for at most this share of its time is fed.
pub const LOOP_FED: f64 = 0.02;
/// Steps a loop's reports must span for a window to take its rate from
/// them (its reports come every other batch).
const LOOP_RATE_STEPS: u64 = 3;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// Measuring the center's rate.
    Center,
    /// Measuring the share `center + direction * step`.
    Probe { direction: f64 },
    /// Measuring `center + direction * FIRST_STEP`, where a fine probe
    /// gained less than the margin.
    Leap { direction: f64 },
    /// At the center, `batches` more before the next measurement.
    Hold { batches: u32 },
}

/// One measurement in progress at `share`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Window {
    share: f64,
    /// Batches placed before `share` was set, still to be handed on.
    let_through: usize,
    batches: u32,
    samples: usize,
    seconds: f64,
    /// The loop's totals when the window's first batch was timed.
    loop_start: Option<LoopTotals>,
}

impl Window {
    fn at(share: f64, placed_before: usize) -> Self {
        Self {
            share,
            let_through: placed_before,
            batches: 0,
            samples: 0,
            seconds: 0.0,
            loop_start: None,
        }
    }
}

/// What a window measured: the rate, and where the client reported its
/// loop's waits over it, the share of the loop's time spent waiting.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Measured {
    rate: f64,
    waiting: Option<f64>,
}

impl Measured {
    fn fed(&self) -> Option<bool> {
        self.waiting.map(|waiting| waiting <= LOOP_FED)
    }

    /// Whether `self`, measured `direction` of `center`, beats it.
    fn beats(&self, center: &Measured, direction: f64) -> bool {
        match (self.fed(), center.fed()) {
            (Some(true), Some(false)) => true,
            (Some(false), Some(true)) => false,
            // Both fed: the higher share spares the trainer.
            (Some(true), Some(true)) => direction > 0.0,
            _ => self.rate > center.rate * (1.0 + MARGIN),
        }
    }

    /// Whether the loop's state the window saw is not the rate alone's
    /// (where a probe that gained less than the margin may be leapt to).
    fn by_rate(&self, center: &Measured) -> bool {
        !matches!((self.fed(), center.fed()), (Some(_), Some(_)))
            || (self.fed() == Some(false) && center.fed() == Some(false))
    }
}

/// A settled search's watch on the loop while it holds.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Watch {
    /// Whether the loop was fed when the center was last measured.
    settled_fed: Option<bool>,
    batches: u32,
    start: Option<LoopTotals>,
}

/// Where a search stands, for a next stream of the same client to go on
/// from: its center, step and holds. A measurement under way is not
/// carried (a new stream's buffers fill anew); the next stream measures
/// the center again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SearchState {
    pub center: f64,
    pub step: f64,
    /// Batches still to hold the center; 0: it was measuring.
    pub hold: u32,
    pub next_hold: u32,
    /// Where the stream hears its loop's waits (0: nowhere); not carried
    /// to the next stream, which listens anew.
    pub loop_id: u64,
}

impl SearchState {
    /// Why a state a client sent cannot be a search's, if it cannot.
    pub fn invalid(&self) -> Option<String> {
        if !(0.0..=1.0).contains(&self.center) {
            return Some(format!("center {} is outside 0..=1", self.center));
        }
        if !(MIN_STEP..=FIRST_STEP).contains(&self.step) {
            return Some(format!(
                "step {} is outside {MIN_STEP}..={FIRST_STEP}",
                self.step
            ));
        }
        if self.hold > MAX_HOLD {
            return Some(format!("hold {} is over {MAX_HOLD}", self.hold));
        }
        if !(FIRST_HOLD..=MAX_HOLD).contains(&self.next_hold) {
            return Some(format!(
                "next_hold {} is outside {FIRST_HOLD}..={MAX_HOLD}",
                self.next_hold
            ));
        }
        None
    }
}

/// A compass search of the share for the client's rate.
#[derive(Debug, Clone, PartialEq)]
pub struct RateSeeker {
    center: f64,
    center_rate: Option<Measured>,
    step: f64,
    phase: Phase,
    window: Window,
    /// Directions tried without gain at this step (bit 0: down, bit 1: up).
    failed: u8,
    /// The fine probe that beat the center by less than the margin, and
    /// its rate: where to leap before holding.
    leaning: Option<(f64, f64)>,
    next_hold: u32,
    /// Whether a batch was handed on yet.
    started: bool,
    watch: Watch,
}

const UNWATCHED: Watch = Watch {
    settled_fed: None,
    batches: 0,
    start: None,
};

impl RateSeeker {
    /// From `start` when the request gives one (a share that an earlier
    /// stream settled at, or the user's guess): fine steps, after a hold.
    /// Without one: the middle, coarse steps at once.
    pub fn new(start: Option<f64>) -> Self {
        let (center, step, phase) = match start {
            Some(start) => (
                start.clamp(0.0, 1.0),
                MIN_STEP,
                Phase::Hold {
                    batches: FIRST_HOLD,
                },
            ),
            None => (0.5, FIRST_STEP, Phase::Center),
        };
        Self {
            center,
            center_rate: None,
            step,
            phase,
            window: Window::at(center, 0),
            failed: 0,
            leaning: None,
            next_hold: FIRST_HOLD,
            started: false,
            watch: UNWATCHED,
        }
    }

    /// Goes on with a search another stream left at `state` (checked
    /// with [`SearchState::invalid`]).
    pub fn resume(state: SearchState) -> Self {
        let phase = match state.hold {
            0 => Phase::Center,
            batches => Phase::Hold { batches },
        };
        Self {
            center: state.center,
            center_rate: None,
            step: state.step,
            phase,
            window: Window::at(state.center, 0),
            failed: 0,
            leaning: None,
            next_hold: state.next_hold,
            started: false,
            watch: UNWATCHED,
        }
    }

    /// Where the search stands (see [`SearchState`]).
    pub fn state(&self) -> SearchState {
        SearchState {
            center: self.center,
            step: self.step,
            hold: match self.phase {
                Phase::Hold { batches } => batches,
                _ => 0,
            },
            next_hold: self.next_hold,
            loop_id: 0,
        }
    }

    /// The share to place the next batch with.
    pub fn share(&self) -> f64 {
        match self.phase {
            Phase::Hold { .. } => self.center,
            Phase::Center | Phase::Probe { .. } | Phase::Leap { .. } => self.window.share,
        }
    }

    /// One batch of `samples` handed on, `interval` after the one before;
    /// `in_flight`: batches placed and not yet taken by the client;
    /// `loop_totals`: the client's latest report of its loop's waits.
    pub fn handed(
        &mut self,
        samples: usize,
        interval: Duration,
        in_flight: usize,
        loop_totals: Option<LoopTotals>,
    ) {
        if !std::mem::replace(&mut self.started, true) {
            // A stream's buffers first fill at the producer's pace, not the
            // client's: twice what they hold goes by untimed.
            self.window.let_through = 2 * in_flight;
        }
        if let Phase::Hold { batches } = self.phase {
            let batches = batches.saturating_sub(1);
            self.phase = Phase::Hold { batches };
            let changed = self.loop_changed(loop_totals);
            if batches == 0 || changed {
                if batches > 0 {
                    // The loop left the state the center settled with: a
                    // fresh search, from fine steps.
                    self.step = 2.0 * MIN_STEP;
                    self.next_hold = FIRST_HOLD;
                    self.failed = 0;
                }
                self.measure(Phase::Center, self.center, in_flight);
            }
            return;
        }
        let window = &mut self.window;
        if window.let_through > 0 {
            window.let_through -= 1;
            return;
        }
        if window.batches == 0 {
            window.loop_start = loop_totals;
        }
        window.batches += 1;
        window.samples += samples;
        window.seconds += interval.as_secs_f64();
        if window.batches < WINDOW_BATCHES {
            return;
        }
        let over_window = window.loop_start.zip(loop_totals);
        let samples_per_batch = window.samples as f64 / f64::from(window.batches);
        // The rate the loop took batches at, where it says: buffers
        // between the two sides (a transport window holding many small
        // encoded batches) can hand batches on faster than it takes them.
        let loop_rate = over_window
            .and_then(|(start, end)| end.steps_per_second_since(&start, LOOP_RATE_STEPS))
            .map(|steps| steps * samples_per_batch);
        let measured = Measured {
            rate: loop_rate.unwrap_or(window.samples as f64 / window.seconds.max(1e-9)),
            waiting: over_window.and_then(|(start, end)| end.waiting_since(&start)),
        };
        self.conclude(measured, in_flight);
    }

    /// While holding: whether the loop, over the last window's worth of
    /// batches, left the state the center settled with by the margin.
    fn loop_changed(&mut self, loop_totals: Option<LoopTotals>) -> bool {
        let watch = &mut self.watch;
        let Some(settled_fed) = watch.settled_fed else {
            return false;
        };
        if watch.start.is_none() {
            watch.start = loop_totals;
            watch.batches = 0;
            return false;
        }
        watch.batches += 1;
        if watch.batches < WINDOW_BATCHES {
            return false;
        }
        let waiting = watch
            .start
            .zip(loop_totals)
            .and_then(|(start, end)| end.waiting_since(&start));
        watch.start = loop_totals;
        watch.batches = 0;
        match waiting {
            Some(waiting) if settled_fed => waiting > 2.0 * LOOP_FED,
            Some(waiting) => waiting < LOOP_FED / 2.0,
            None => false,
        }
    }

    fn conclude(&mut self, measured: Measured, in_flight: usize) {
        match self.phase {
            Phase::Center => {
                self.center_rate = Some(measured);
                self.probe_next(1.0, in_flight);
            }
            Phase::Probe { direction } => {
                let center = self.center_rate.unwrap_or(Measured {
                    rate: 0.0,
                    waiting: None,
                });
                if measured.beats(&center, direction) {
                    // A far start reaches the best in a few moves.
                    self.move_to(measured, (self.step * 2.0).min(FIRST_STEP));
                    self.probe_next(direction, in_flight);
                } else {
                    let rate = measured.rate;
                    if self.step <= MIN_STEP
                        && measured.by_rate(&center)
                        && rate > center.rate
                        && self.leaning.is_none_or(|(_, best)| rate > best)
                    {
                        self.leaning = Some((direction, rate));
                    }
                    self.failed |= bit(direction);
                    self.probe_next(-direction, in_flight);
                }
            }
            Phase::Leap { direction } => {
                let center = self.center_rate.unwrap_or(Measured {
                    rate: 0.0,
                    waiting: None,
                });
                if measured.beats(&center, direction) {
                    self.move_to(measured, FIRST_STEP);
                    self.probe_next(direction, in_flight);
                } else {
                    self.hold();
                }
            }
            Phase::Hold { .. } => unreachable!("a hold measures nothing"),
        }
    }

    /// Probes `direction` (a step away, or to the end of 0..=1 where that
    /// is nearer) unless it was tried at this step or the center is at that
    /// end; else the other side. With both tried: a finer step from a fresh
    /// center, or at the finest step, a hold.
    fn probe_next(&mut self, direction: f64, in_flight: usize) {
        for direction in [direction, -direction] {
            let share = (self.center + direction * self.step).clamp(0.0, 1.0);
            if self.failed & bit(direction) == 0 && (share - self.center).abs() > 1e-9 {
                self.measure(Phase::Probe { direction }, share, in_flight);
                return;
            }
            self.failed |= bit(direction);
        }
        self.failed = 0;
        if self.step > MIN_STEP {
            self.step = (self.step / 2.0).max(MIN_STEP);
            self.measure(Phase::Center, self.center, in_flight);
            return;
        }
        if let Some((direction, _)) = self.leaning.take() {
            let share = (self.center + direction * FIRST_STEP).clamp(0.0, 1.0);
            if (share - self.center).abs() > 1e-9 {
                self.measure(Phase::Leap { direction }, share, in_flight);
                return;
            }
        }
        self.hold();
    }

    /// The measured window's share becomes the center.
    fn move_to(&mut self, measured: Measured, step: f64) {
        tracing::debug!(
            from = self.center,
            to = self.window.share,
            rate = measured.rate,
            loop_waiting = measured.waiting,
            center_rate = self.center_rate.map(|center| center.rate),
            "the server's decode share moved"
        );
        self.center = self.window.share;
        self.center_rate = Some(measured);
        self.failed = 0;
        self.leaning = None;
        self.next_hold = FIRST_HOLD;
        self.step = step;
    }

    fn hold(&mut self) {
        self.leaning = None;
        self.watch = Watch {
            settled_fed: self.center_rate.and_then(|center| center.fed()),
            ..UNWATCHED
        };
        self.phase = Phase::Hold {
            batches: self.next_hold,
        };
        self.next_hold = (self.next_hold * 2).min(MAX_HOLD);
    }

    fn measure(&mut self, phase: Phase, share: f64, in_flight: usize) {
        self.phase = phase;
        self.window = Window::at(share, in_flight);
    }
}

fn bit(direction: f64) -> u8 {
    if direction > 0.0 {
        2
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
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
        mut seeker: RateSeeker,
        curve: impl Fn(f64) -> f64,
        batches: usize,
        noise: f64,
    ) -> (RateSeeker, Vec<f64>, f64) {
        let lag = 7;
        let mut placed = std::collections::VecDeque::new();
        let mut shares = Vec::new();
        let (mut late_samples, mut late_seconds) = (0.0, 0.0);
        let mut jitter = 0x9e37_79b9_u32;
        for batch in 0..batches {
            placed.push_back(seeker.share());
            shares.push(seeker.share());
            if placed.len() <= lag {
                continue;
            }
            let taken = placed.pop_front().unwrap();
            let wobble = wobble(&mut jitter, noise);
            let seconds = 128.0 / curve(taken) * wobble;
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
}
