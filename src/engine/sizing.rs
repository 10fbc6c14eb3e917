//! Settings the sidecar sizes for itself where no flag sets them, and the
//! record of every sizing choice: logged once at start and exported as
//! `shardfeed_setting{name, source}`, so that a fleet's dashboards show
//! what each host chose and why.
//!
//! Decode threads follow the CPUs this process may use: its cgroup's CPU
//! quota where one binds (a pod's `limits.cpu`), else its container's CPU
//! request where the chart passes it, within the cores its affinity
//! allows. The host's core count is the wrong default in a
//! container: a sidecar limited to 4 CPUs on a 96-core node that starts 96
//! decode threads is throttled in every CFS period, and each batch then
//! waits on the slowest throttled thread.

use std::path::Path;

use super::cgroup;

/// Where a setting's value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A flag or its environment variable.
    Flag,
    /// The cgroup's CPU quota.
    CgroupQuota,
    /// The container's CPU request (`--cpu-request-millicores`, which the
    /// chart fills from the Downward API), where no quota binds.
    CpuRequest,
    /// The cores this process's affinity allows (no quota binds).
    Cores,
    /// The cgroup's memory limit.
    CgroupMemory,
    /// The machine's memory (no cgroup limit binds).
    MachineMemory,
    /// Sized by each stream as it runs, from this start.
    Sized,
    /// The built-in default.
    Default,
}

impl Source {
    pub fn label(self) -> &'static str {
        match self {
            Self::Flag => "flag",
            Self::CgroupQuota => "cgroup_cpu_quota",
            Self::CpuRequest => "cpu_request",
            Self::Cores => "cores",
            Self::CgroupMemory => "cgroup_memory_limit",
            Self::MachineMemory => "machine_memory",
            Self::Sized => "sized_per_stream",
            Self::Default => "default",
        }
    }
}

/// A setting's value and where it came from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Chosen<T> {
    pub value: T,
    pub source: Source,
}

impl<T> Chosen<T> {
    /// `flag` where given, else `default` from `source`.
    pub fn or(flag: Option<T>, default: impl FnOnce() -> Chosen<T>) -> Self {
        match flag {
            Some(value) => Self {
                value,
                source: Source::Flag,
            },
            None => default(),
        }
    }
}

/// The CPUs a sidecar may count on, as far as it can tell.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuBudget {
    /// Cores its affinity allows.
    pub allowed_cores: usize,
    /// Its cgroup's CPU quota, in CPUs (a container's `limits.cpu`).
    pub quota: Option<f64>,
    /// Its container's CPU request, in CPUs: what it is promised where no
    /// limit caps it (many clusters set requests only; the node's other
    /// cores are the trainer's).
    pub request: Option<f64>,
}

impl CpuBudget {
    /// This host's, with the request a flag gave (millicores).
    pub fn detect(request_millicores: Option<u64>) -> Self {
        let root = Path::new("/");
        Self {
            allowed_cores: allowed_cores(root),
            quota: cgroup::cpu_quota(root),
            request: request_millicores
                .filter(|&m| m > 0)
                .map(|m| m as f64 / 1000.0),
        }
    }

    /// Decode threads: the quota, else the request, rounded to the nearest
    /// whole thread (2.5 CPUs run three, each throttled a little, rather
    /// than leave half a CPU idle; the I/O threads take a share too), at
    /// least one and at most the cores; else one per core.
    pub fn decode_threads(&self) -> Chosen<usize> {
        let allowed_cores = self.allowed_cores.max(1);
        let usable = |cpus: Option<f64>| cpus.filter(|c| c.is_finite() && *c > 0.0);
        let (cpus, source) = match (usable(self.quota), usable(self.request)) {
            (Some(quota), _) => (quota, Source::CgroupQuota),
            (None, Some(request)) => (request, Source::CpuRequest),
            (None, None) => {
                return Chosen {
                    value: allowed_cores,
                    source: Source::Cores,
                }
            }
        };
        Chosen {
            value: (cpus.round() as usize).clamp(1, allowed_cores),
            source,
        }
    }
}

/// This host's decode threads, without a CPU request (see
/// [`CpuBudget::decode_threads`]).
pub fn detect_decode_threads() -> Chosen<usize> {
    CpuBudget::detect(None).decode_threads()
}

/// The cores this process may run on: its affinity mask
/// (`Cpus_allowed_list` of `/proc/self/status` under `root`), else what the
/// standard library reports.
fn allowed_cores(root: &Path) -> usize {
    std::fs::read_to_string(root.join("proc/self/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))
                .and_then(|list| count_cpu_list(list.trim()))
        })
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from))
}

/// Cores in a list like `0-3,8,10-11`; None if it does not parse.
fn count_cpu_list(list: &str) -> Option<usize> {
    let mut count = 0;
    for range in list.split(',').filter(|r| !r.is_empty()) {
        count += match range.split_once('-') {
            Some((first, last)) => {
                let (first, last): (usize, usize) = (first.parse().ok()?, last.parse().ok()?);
                last.checked_sub(first)? + 1
            }
            None => {
                range.parse::<usize>().ok()?;
                1
            }
        };
    }
    (count > 0).then_some(count)
}

/// Logs one sizing choice and exports it as a gauge.
pub fn record(name: &'static str, value: f64, source: Source) {
    tracing::info!(setting = name, value, source = source.label(), "sized");
    ::metrics::gauge!(crate::metrics::SETTING, "name" => name, "source" => source.label())
        .set(value);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn threads(allowed_cores: usize, quota: Option<f64>, request: Option<f64>) -> Chosen<usize> {
        CpuBudget {
            allowed_cores,
            quota,
            request,
        }
        .decode_threads()
    }

    #[test]
    fn threads_follow_the_quota_then_the_request_within_the_cores() {
        assert_eq!(threads(96, Some(4.0), None).value, 4);
        assert_eq!(threads(96, Some(4.0), None).source, Source::CgroupQuota);
        assert_eq!(threads(96, Some(2.5), None).value, 3);
        assert_eq!(threads(96, Some(0.2), None).value, 1, "at least one");
        assert_eq!(
            threads(2, Some(8.0), None).value,
            2,
            "no more than the cores"
        );
        assert_eq!(
            threads(96, Some(6.0), Some(4.0)).value,
            6,
            "a limit binds before a request"
        );
        assert_eq!(
            threads(96, None, Some(4.0)),
            Chosen {
                value: 4,
                source: Source::CpuRequest
            }
        );
        assert_eq!(
            threads(16, None, None),
            Chosen {
                value: 16,
                source: Source::Cores
            }
        );
        assert_eq!(threads(0, None, None).value, 1);
        let budget = CpuBudget::detect(Some(0));
        assert_eq!(budget.request, None, "the Downward API's 0: no request");
        assert_eq!(CpuBudget::detect(Some(2500)).request, Some(2.5));
    }

    #[test]
    fn the_affinity_list_counts_cores() {
        assert_eq!(count_cpu_list("0-3,8,10-11"), Some(7));
        assert_eq!(count_cpu_list("5"), Some(1));
        assert_eq!(count_cpu_list(""), None);
        assert_eq!(count_cpu_list("3-1"), None);
        assert_eq!(count_cpu_list("x"), None);
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("proc/self")).unwrap();
        std::fs::write(
            root.path().join("proc/self/status"),
            "Name:\tshardfeed\nCpus_allowed:\tff\nCpus_allowed_list:\t0-1,4-5\n",
        )
        .unwrap();
        assert_eq!(allowed_cores(root.path()), 4);
    }

    #[test]
    fn a_flag_wins_over_the_default() {
        let chosen = Chosen::or(Some(3), || threads(8, None, None));
        assert_eq!(chosen.value, 3);
        assert_eq!(chosen.source, Source::Flag);
        assert_eq!(Chosen::or(None, || threads(8, None, None)).value, 8);
    }
}
