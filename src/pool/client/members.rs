//! The pool's membership: the workers the targets (a headless Service's
//! name) resolve to, followed as workers come and go, re-resolved at once
//! when a worker cannot be reached and backed off while resolution fails.

use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::{Inner, Worker};
use crate::metrics::pool as pool_metrics;

const MIN_RERESOLVE: Duration = Duration::from_secs(1);
const MAX_RESOLVE_BACKOFF: Duration = Duration::from_secs(30);
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Keeps `inner.members` equal to what the targets resolve to, until the
/// client is dropped.
pub(super) async fn follow(inner: Weak<Inner>) {
    let mut backoff = MIN_RERESOLVE;
    loop {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let resolved = resolve_all(&strong.config.targets).await;
        let wait = match resolved {
            Ok(addrs) => {
                update(&strong, addrs);
                backoff = MIN_RERESOLVE;
                strong.config.refresh
            }
            Err(message) => {
                tracing::warn!(
                    targets = ?strong.config.targets,
                    %message,
                    retry_in_s = backoff.as_secs_f64(),
                    "cannot resolve the decode pool; decoding locally meanwhile"
                );
                let wait = backoff;
                backoff = (backoff * 2).min(MAX_RESOLVE_BACKOFF);
                wait
            }
        };
        let reresolve = async {
            strong.reresolve.notified().await;
            // At most once a second, however many attempts fail.
            tokio::time::sleep(MIN_RERESOLVE).await;
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = reresolve => {}
        }
        drop(strong);
    }
}

/// Every target's addresses; an error only when none resolves.
async fn resolve_all(targets: &[String]) -> Result<Vec<SocketAddr>, String> {
    let mut addrs = Vec::new();
    let mut errors = Vec::new();
    for target in targets {
        match tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host(target.as_str())).await
        {
            Ok(Ok(found)) => addrs.extend(found),
            Ok(Err(error)) => errors.push(format!("{target}: {error}")),
            Err(_) => errors.push(format!("{target}: timed out")),
        }
    }
    if addrs.is_empty() && !errors.is_empty() {
        return Err(errors.join("; "));
    }
    addrs.sort();
    addrs.dedup();
    Ok(addrs)
}

/// Replaces the membership with `addrs`, keeping the workers (and their
/// links, cool-downs and slots) that stay.
pub(super) fn update(inner: &Inner, mut addrs: Vec<SocketAddr>) {
    addrs.sort();
    addrs.dedup();
    let mut members = inner.members.lock().unwrap_or_else(|e| e.into_inner());
    if members.len() == addrs.len() && members.iter().zip(&addrs).all(|(w, a)| w.addr == *a) {
        return;
    }
    let next: Vec<Arc<Worker>> = addrs
        .iter()
        .filter_map(
            |&addr| match members.binary_search_by_key(&addr, |w| w.addr) {
                Ok(at) => Some(members[at].clone()),
                Err(_) => {
                    let link = inner.connector.connect(addr)?;
                    Some(Arc::new(Worker::new(
                        addr,
                        link,
                        inner.config.units_per_worker,
                    )))
                }
            },
        )
        .collect();
    *members = Arc::new(next);
    drop(members);
    // Thousands of workers would make this line a page: a count, and the
    // addresses only where they fit on a line.
    if addrs.len() <= 16 {
        tracing::info!(workers = ?addrs, "decode pool membership changed");
    } else {
        tracing::info!(workers = addrs.len(), "decode pool membership changed");
    }
    pool_metrics::workers(addrs.len());
}
