//! Settings the sidecar sizes for itself where no flag sets them, and the
//! record of every sizing choice: logged once at start and exported as
//! `shardfeed_setting{name, source}`, so that a fleet's dashboards show
//! what each host chose and why.
//!
//! Decode threads follow the CPUs this process may use: its cgroup's CPU
//! quota where one binds (a pod's `limits.cpu`), within the cores its
//! affinity allows. The host's core count is the wrong default in a
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
    /// The cores this process's affinity allows (no quota binds).
    Cores,
    /// The cgroup's memory limit.
    CgroupMemory,
    /// The machine's memory (no cgroup limit binds).
    MachineMemory,
    /// The built-in default.
    Default,
}

impl Source {
    pub fn label(self) -> &'static str {
        match self {
            Self::Flag => "flag",
            Self::CgroupQuota => "cgroup_cpu_quota",
            Self::Cores => "cores",
            Self::CgroupMemory => "cgroup_memory_limit",
            Self::MachineMemory => "machine_memory",
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

/// Decode threads for `quota` CPUs (None: no quota) and `allowed_cores`:
/// the quota rounded to the nearest whole thread (a 2.5-CPU quota runs
/// three, each throttled a little, rather than leave half a CPU idle; the
/// I/O threads take a share too), at least one, at most the cores.
pub fn decode_threads_for(allowed_cores: usize, quota: Option<f64>) -> Chosen<usize> {
    let allowed_cores = allowed_cores.max(1);
    match quota {
        Some(cpus) if cpus.is_finite() && cpus > 0.0 => Chosen {
            value: (cpus.round() as usize).clamp(1, allowed_cores),
            source: Source::CgroupQuota,
        },
        _ => Chosen {
            value: allowed_cores,
            source: Source::Cores,
        },
    }
}

/// This host's decode threads (see [`decode_threads_for`]).
pub fn detect_decode_threads() -> Chosen<usize> {
    let root = Path::new("/");
    decode_threads_for(allowed_cores(root), cgroup::cpu_quota(root))
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

    #[test]
    fn threads_follow_the_quota_within_the_cores() {
        let threads = |cores, quota| decode_threads_for(cores, quota);
        assert_eq!(threads(96, Some(4.0)).value, 4);
        assert_eq!(threads(96, Some(4.0)).source, Source::CgroupQuota);
        assert_eq!(threads(96, Some(2.5)).value, 3);
        assert_eq!(threads(96, Some(0.2)).value, 1, "at least one");
        assert_eq!(threads(2, Some(8.0)).value, 2, "no more than the cores");
        assert_eq!(
            threads(16, None),
            Chosen {
                value: 16,
                source: Source::Cores
            }
        );
        assert_eq!(threads(0, None).value, 1);
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
        let sized = Chosen::or(Some(3), || decode_threads_for(8, None));
        assert_eq!(sized.value, 3);
        assert_eq!(sized.source, Source::Flag);
        assert_eq!(Chosen::or(None, || decode_threads_for(8, None)).value, 8);
    }
}
