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
//! A window's rate is noisy: on a CPU shared by trainer and sidecar, two
//! windows at the same share differed by 20-40% (the loop's Python, its
//! collector, the reports), far past the margin. So the search measures
//! its noise, each time it times one share twice (the center again after
//! a hold or a finer step, or after a probe that seemed to win), as the
//! relative gap of the two timings, averaged. A probe's gain is believed
//! at once only past `NOISE_TIMES` that noise (and the margin); below it,
//! or before any noise is known, the center is timed again and the probe
//! must beat both of its timings. A win the noise made is then mostly a
//! second center timing that is higher, and nothing moves; a loss needs
//! no second look, as staying is safe. Noisy windows are also made longer
//! (`window_batches`), up to four times, but a probe that is worse than
//! the center by more than the noise after the shortest window ends there:
//! its batches are the dear ones. The noise goes on with the
//! search to the next stream.
//!
//! A gentle slope defeats fine probes: where a trainer's GPU both decodes
//! and trains, each sixteenth of the share the sidecar takes over gains
//! ~1.5%, under the margin, though three quarters gain ~20% (an H200
//! feeding ResNet-50 held share 0 at 0.77x its synthetic rate). So when
//! neither fine probe beat the center by the margin but one beat it at
//! all, and by more than the center's two timings differ (the gain is
//! above the windows' noise), the search leaps `FIRST_STEP` that way
//! before it holds; a leap that wins is checked the same way.
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
/// A gain past this many times the measured noise is believed from one
/// timing of each share.
const NOISE_TIMES: f64 = 2.0;
/// Windows as noisy as this, or less, are `WINDOW_BATCHES` long; noisier
/// ones longer by the square of how much (the gap of two averages
/// shrinks with the root of their length), at most `MAX_WINDOW_TIMES`.
const QUIET_NOISE: f64 = 0.05;
const MAX_WINDOW_TIMES: f64 = 4.0;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// Measuring the center's rate.
    Center,
    /// Measuring the share `center + direction * step`.
    Probe { direction: f64 },
    /// Measuring `center + direction * FIRST_STEP`, where a fine probe
    /// gained less than the margin.
    Leap { direction: f64 },
    /// Timing the center again after a probe (or a leap) at `share`,
    /// measured as `probe`, seemed to beat it.
    Recheck {
        direction: f64,
        leap: bool,
        share: f64,
        probe: Measured,
    },
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

    /// How much higher `self`'s rate is than `center`'s, relative.
    fn gain_over(&self, center: &Measured) -> f64 {
        if center.rate > 0.0 {
            self.rate / center.rate - 1.0
        } else {
            f64::INFINITY
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
    /// The windows' relative noise (None: not measured yet).
    pub noise: Option<f64>,
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
        if let Some(noise) = self.noise.filter(|noise| !(0.0..=1.0).contains(noise)) {
            return Some(format!("noise {noise} is outside 0..=1"));
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
    /// The windows' relative noise, from shares timed twice.
    noise: Option<f64>,
    next_hold: u32,
    /// Whether a batch was handed on yet.
    started: bool,
    watch: Watch,
}

/// A center not measured yet: anything beats it.
const UNMEASURED: Measured = Measured {
    rate: 0.0,
    waiting: None,
};

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
            noise: None,
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
            noise: state.noise,
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
            noise: self.noise,
        }
    }

    /// The share to place the next batch with.
    pub fn share(&self) -> f64 {
        match self.phase {
            Phase::Hold { .. } => self.center,
            Phase::Center | Phase::Probe { .. } | Phase::Leap { .. } | Phase::Recheck { .. } => {
                self.window.share
            }
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
                    // Timed at the loop's old pace: no measure of noise.
                    self.center_rate = None;
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
        if window.batches >= window_batches(self.noise) || self.clearly_losing(&measured) {
            self.conclude(measured, in_flight);
        }
    }

    /// A probe or leap whose window, so far, is worse than the center by
    /// more than the noise: it ends at the shortest window, as a loss needs
    /// no precision (staying is safe) and its batches cost the most where
    /// the share is worst (a trainer's full-size decode on its CPU).
    fn clearly_losing(&self, so_far: &Measured) -> bool {
        let (Some(center), Some(noise)) = (self.center_rate, self.noise) else {
            return false;
        };
        matches!(self.phase, Phase::Probe { .. } | Phase::Leap { .. })
            && so_far.by_rate(&center)
            && so_far.rate < center.rate * (1.0 - noise)
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
        tracing::debug!(
            phase = ?self.phase,
            share = self.window.share,
            rate = measured.rate,
            loop_waiting = measured.waiting,
            in_flight,
            "a share's window measured"
        );
        match self.phase {
            Phase::Center => {
                if let Some(earlier) = self.center_rate {
                    self.learn_noise(&earlier, &measured);
                }
                self.center_rate = Some(measured);
                self.probe_next(1.0, in_flight);
            }
            Phase::Probe { direction } => {
                let center = self.center_rate.unwrap_or(UNMEASURED);
                let gain = measured.gain_over(&center);
                let leans = self.step <= MIN_STEP && measured.by_rate(&center) && gain > 0.0;
                if measured.beats(&center, direction) {
                    if self.believed(&measured, &center) {
                        // A far start reaches the best in a few moves.
                        let step = (self.step * 2.0).min(FIRST_STEP);
                        self.move_to(self.window.share, measured, step);
                        self.probe_next(direction, in_flight);
                    } else {
                        self.recheck(direction, false, measured, in_flight);
                    }
                } else if leans && self.noise.is_none() {
                    self.recheck(direction, false, measured, in_flight);
                } else {
                    if leans && self.noise.is_some_and(|noise| gain > noise) {
                        self.lean(direction, measured.rate);
                    }
                    self.failed |= bit(direction);
                    self.probe_next(-direction, in_flight);
                }
            }
            Phase::Leap { direction } => {
                let center = self.center_rate.unwrap_or(UNMEASURED);
                if !measured.beats(&center, direction) {
                    self.hold();
                } else if self.believed(&measured, &center) {
                    self.move_to(self.window.share, measured, FIRST_STEP);
                    self.probe_next(direction, in_flight);
                } else {
                    self.recheck(direction, true, measured, in_flight);
                }
            }
            Phase::Recheck {
                direction,
                leap,
                share,
                probe,
            } => {
                let first = self.center_rate.unwrap_or(UNMEASURED);
                self.learn_noise(&first, &measured);
                self.center_rate = Some(measured);
                if probe.beats(&first, direction) && probe.beats(&measured, direction) {
                    let step = if leap {
                        FIRST_STEP
                    } else {
                        (self.step * 2.0).min(FIRST_STEP)
                    };
                    self.move_to(share, probe, step);
                    self.probe_next(direction, in_flight);
                    return;
                }
                if leap {
                    self.hold();
                    return;
                }
                // Gained over both timings of the center by more than they
                // differ: a gentle slope, not the windows' noise.
                let noise = (first.rate - measured.rate).abs();
                let gain = probe.rate - first.rate.max(measured.rate);
                if self.step <= MIN_STEP && probe.by_rate(&measured) && gain > noise {
                    self.lean(direction, probe.rate);
                }
                self.failed |= bit(direction);
                self.probe_next(-direction, in_flight);
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

    /// Whether `measured`'s win over `center` stands on one timing each:
    /// decided by the loop's state (its thresholds keep their own
    /// margins), or a gain past the measured noise.
    fn believed(&self, measured: &Measured, center: &Measured) -> bool {
        !measured.by_rate(center)
            || self
                .noise
                .is_some_and(|noise| measured.gain_over(center) > NOISE_TIMES * noise)
    }

    /// One share timed twice: the relative gap between the two, averaged
    /// with what was measured before.
    fn learn_noise(&mut self, earlier: &Measured, later: &Measured) {
        let high = earlier.rate.max(later.rate);
        if high <= 0.0 {
            return;
        }
        let gap = ((earlier.rate - later.rate).abs() / high).min(1.0);
        self.noise = Some(self.noise.map_or(gap, |noise| (noise + gap) / 2.0));
    }

    fn lean(&mut self, direction: f64, rate: f64) {
        if self.leaning.is_none_or(|(_, best)| rate > best) {
            self.leaning = Some((direction, rate));
        }
    }

    /// Times the center again before a probe's (or leap's) seeming win
    /// at the window's share is believed.
    fn recheck(&mut self, direction: f64, leap: bool, measured: Measured, in_flight: usize) {
        let phase = Phase::Recheck {
            direction,
            leap,
            share: self.window.share,
            probe: measured,
        };
        self.measure(phase, self.center, in_flight);
    }

    /// `share`, measured as `measured`, becomes the center.
    fn move_to(&mut self, share: f64, measured: Measured, step: f64) {
        tracing::debug!(
            from = self.center,
            to = share,
            rate = measured.rate,
            loop_waiting = measured.waiting,
            center_rate = self.center_rate.map(|center| center.rate),
            "the server's decode share moved"
        );
        self.center = share;
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

/// Batches timed at one share, where the windows' noise is `noise`.
fn window_batches(noise: Option<f64>) -> u32 {
    let times = noise.map_or(1.0, |noise| {
        (noise / QUIET_NOISE)
            .powi(2)
            .ceil()
            .clamp(1.0, MAX_WINDOW_TIMES)
    });
    WINDOW_BATCHES * times as u32
}

fn bit(direction: f64) -> u8 {
    if direction > 0.0 {
        2
    } else {
        1
    }
}

#[cfg(test)]
#[path = "seek_tests.rs"]
mod tests;
