//! New connections closed at accept because a bound is full. Under a flood
//! each one would log: the counter (`shardfeed_connections_closed_total`,
//! by reason) says how many, the log says once a minute that it happens.

use std::time::Duration;

use crate::metrics::log_gate::LogGate;

#[derive(Debug)]
pub struct Refusals {
    /// The counter's `reason` label.
    reason: &'static str,
    gate: LogGate,
}

impl Refusals {
    pub fn new(reason: &'static str) -> Self {
        Self {
            reason,
            gate: LogGate::new(Duration::from_secs(60)),
        }
    }

    /// Closes `connection` before a byte of it is read and counts it;
    /// `log` runs, with how many went unlogged since, when this one is to
    /// be logged.
    pub fn close<C>(&self, connection: C, log: impl FnOnce(&C, u64)) {
        metrics::counter!(crate::metrics::CONNECTIONS_CLOSED, "reason" => self.reason).increment(1);
        if let Some(left_out) = self.gate.open() {
            log(&connection, left_out);
        }
        drop(connection);
    }
}
