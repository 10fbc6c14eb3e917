//! The decode pool's 1,000-rank simulation (issue 35): `cargo run --release
//! --example pool_sim -- [churn|step] [hosts] [seconds] [decode_ahead]`. `churn`: 125
//! hosts x 8 ranks at 24,000 samples/s a host against a pool that loses 5%
//! of its pods a minute, is partitioned, grown by half and cut by half.
//! `step`: the chart's autoscaling rule following a demand step from
//! 24,000 to 80,000 samples/s a host and back. Virtual time: a paused tokio
//! clock, which test builds (and so examples) enable.

use shardfeed::dev::pool_sim;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let scenario = args.first().map_or("churn", String::as_str);
    let number =
        |at: usize, default: f64| args.get(at).and_then(|s| s.parse().ok()).unwrap_or(default);
    let mut spec = match scenario {
        "churn" => pool_sim::churn(number(1, 125.0) as usize, number(2, 70.0)),
        "step" => pool_sim::demand_step(number(1, 4.0) as usize, number(2, 600.0)),
        other => {
            eprintln!("unknown scenario {other:?}: churn or step");
            std::process::exit(2);
        }
    };
    if let Some(ahead) = args.get(3).and_then(|s| s.parse().ok()) {
        spec.decode_ahead = ahead;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a tokio runtime");
    let wall = std::time::Instant::now();
    let report = runtime.block_on(pool_sim::run(spec.clone()));
    pool_sim::print(&spec, &report);
    println!("({:.0} s of wall time)", wall.elapsed().as_secs_f64());
}
