//! The pool simulation's invariants at a scale a test can run: the
//! sidecar's dispatch code against pods that are killed, partitioned,
//! resized and autoscaled, in virtual time. The 1,000-rank figures come
//! from `cargo run --release --example pool_sim` (see docs/decoding.md).

use shardfeed::dev::pool_sim::{self, SimReport, SimSpec};

fn assert_exactly_once(report: &SimReport) {
    assert!(report.samples > 0);
    assert_eq!(report.duplicates, 0, "samples delivered twice");
    assert_eq!(report.losses, 0, "samples lost");
    assert_eq!(report.misplaced, 0, "samples in another's slot");
}

#[tokio::test(start_paused = true)]
async fn churn_loses_and_repeats_nothing_and_placement_moves_one_nth() {
    let mut spec: SimSpec = pool_sim::churn(3, 35.0);
    // Enough losses in 35 s to kill several pods mid-unit.
    spec.loss_per_minute = 0.6;
    let report = pool_sim::run(spec.clone()).await;
    assert_exactly_once(&report);
    assert!(report.killed >= 3, "{} pods lost", report.killed);
    assert!(report.hedged > 0 && report.reissued > 0, "{report:?}");
    assert!(report.remote_share > 0.5, "{report:?}");
    // Before the pool is cut below the demand, trainers do not wait.
    let steady = report.waits.iter().find(|w| w.0 == "steady").unwrap();
    assert!(steady.5 < 0.5, "steady p99.9 wait {} steps", steady.5);
    for moved in [report.moved_on_join, report.moved_on_leave] {
        assert!(
            (moved - report.one_nth).abs() < report.one_nth * 0.3,
            "{moved} of units moved, 1/N = {}",
            report.one_nth
        );
    }
}

#[tokio::test(start_paused = true)]
async fn the_rule_follows_a_demand_step_without_flapping() {
    let mut spec = pool_sim::demand_step(1, 200.0);
    // Fewer units to simulate: the rule sees samples/s, not units.
    spec.unit_samples = 32;
    spec.demand = vec![(0.0, 24_000.0), (30.0, 80_000.0), (120.0, 24_000.0)];
    let report = pool_sim::run(spec.clone()).await;
    assert_exactly_once(&report);
    let steps = pool_sim::step_responses(&spec, &report);
    let up = &steps[0];
    let reached = up
        .reached_90
        .expect("the pool never reached 90% of the demand");
    // Two polls, a doubling per 30 s and a pod start, not minutes.
    assert!(reached < 75.0, "90% of the workers after {reached} s");
    assert!(up.overshoot < 0.25, "overshoot {}", up.overshoot);
    assert_eq!(up.reversals, 0, "the replicas flapped");
}
