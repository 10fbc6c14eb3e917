//! The limits of this process's own cgroup, wherever the host mounts it:
//! cgroup v1, v2, or both (a "hybrid" host: v1 controllers under
//! `/sys/fs/cgroup/<controller>`, v2 under `/sys/fs/cgroup/unified`). Two
//! are read: the memory limit (the stream budget's default) and the CPU
//! quota (the decode threads' default).
//!
//! A cgroup mount is not always this process's cgroup. Under a systemd
//! slice, a Slurm job, or a container runtime without cgroup namespaces, the
//! mount shows the whole hierarchy and the process sits deep inside it:
//! `/proc/self/cgroup` names its path, `/proc/self/mountinfo` says which part
//! of the hierarchy each mount shows and where. Reading the file at the
//! mount's top gives the host's (usually unlimited) value, and a stream
//! budget planned from the machine's RAM gets the process OOM-killed (a
//! decode pool sized from the host's cores gets throttled). So a limit is
//! read at this process's own cgroup and at every ancestor visible in the
//! mount, and the smallest applies (a parent's limit binds its children).
//!
//! Everything is read below a root directory so that tests can lay out the
//! `/proc` and `/sys` of each kind of host in a temp dir.

use std::path::{Path, PathBuf};

/// v1 reports "no limit" as a huge number (a page-rounded `i64::MAX`).
const V1_UNLIMITED: u64 = 1 << 62;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

/// A controller whose limit is read: its v1 name, and how a cgroup
/// directory states its limit in each version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Controller {
    Memory,
    Cpu,
}

impl Controller {
    fn v1_name(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Cpu => "cpu",
        }
    }

    /// The limit set at `dir` (bytes; CPUs), None where none is.
    fn limit_at(self, dir: &Path, version: Version) -> Option<f64> {
        let read = |file: &str| std::fs::read_to_string(dir.join(file)).ok();
        match (self, version) {
            (Self::Memory, Version::V1) => {
                parse_bytes(&read("memory.limit_in_bytes")?).map(|b| b as f64)
            }
            (Self::Memory, Version::V2) => parse_bytes(&read("memory.max")?).map(|b| b as f64),
            (Self::Cpu, Version::V1) => {
                let quota: i64 = read("cpu.cfs_quota_us")?.trim().parse().ok()?;
                let period: u64 = read("cpu.cfs_period_us")?.trim().parse().ok()?;
                cpus(quota, period)
            }
            (Self::Cpu, Version::V2) => {
                // "max 100000", or "<quota> <period>".
                let text = read("cpu.max")?;
                let mut fields = text.split_whitespace();
                let quota: i64 = fields.next()?.parse().ok()?;
                let period: u64 = fields.next().map_or(Some(100_000), |p| p.parse().ok())?;
                cpus(quota, period)
            }
        }
    }
}

/// The memory limit that binds this process through its cgroups, if any,
/// reading `/proc` and `/sys` under `root` (`/` on a real host).
pub fn memory_limit(root: &Path) -> Option<u64> {
    smallest_limit(root, Controller::Memory).map(|bytes| bytes as u64)
}

/// The CPUs this process's cgroups let it use (quota over period: 2.5 is
/// 250 ms of CPU each 100 ms), if any quota binds.
pub fn cpu_quota(root: &Path) -> Option<f64> {
    smallest_limit(root, Controller::Cpu)
}

fn smallest_limit(root: &Path, controller: Controller) -> Option<f64> {
    let read = |path: &str| std::fs::read_to_string(root.join(path.trim_start_matches('/')));
    let membership = read("/proc/self/cgroup").ok()?;
    let mountinfo = read("/proc/self/mountinfo").ok()?;
    let mut limits = Vec::new();
    for (version, path) in own_cgroups(&membership, controller) {
        for mount in mounts(&mountinfo, version, controller) {
            if let Some(limit) = limit_along(root, &mount, &path, version, controller) {
                limits.push(limit);
            }
        }
    }
    limits.into_iter().reduce(f64::min)
}

/// This process's cgroup paths for `controller`: its v1 hierarchy's and
/// the v2 unified one's (`0::/path`).
fn own_cgroups(membership: &str, controller: Controller) -> Vec<(Version, String)> {
    membership
        .lines()
        .filter_map(|line| {
            let mut fields = line.splitn(3, ':');
            let (id, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
            if id == "0" && controllers.is_empty() {
                Some((Version::V2, path.to_string()))
            } else if controllers.split(',').any(|c| c == controller.v1_name()) {
                Some((Version::V1, path.to_string()))
            } else {
                None
            }
        })
        .collect()
}

/// A cgroup mount: the part of the hierarchy it shows, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mount {
    /// The cgroup path shown at the mount point (`/` unless the mount is
    /// of a subtree, as inside a container without a cgroup namespace).
    hierarchy_root: String,
    mount_point: String,
}

/// The mounts of `version` holding `controller`. A mountinfo line:
/// `id parent maj:min root mount-point options [optional...] - fstype source super-options`.
fn mounts(mountinfo: &str, version: Version, controller: Controller) -> Vec<Mount> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let fields: Vec<&str> = before.split(' ').collect();
            let mut after = after.split(' ');
            let (fstype, _source, options) = (after.next()?, after.next()?, after.next()?);
            let wanted = match version {
                Version::V1 => {
                    fstype == "cgroup" && options.split(',').any(|o| o == controller.v1_name())
                }
                Version::V2 => fstype == "cgroup2",
            };
            if !wanted {
                return None;
            }
            Some(Mount {
                hierarchy_root: unescape(fields.get(3)?),
                mount_point: unescape(fields.get(4)?),
            })
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let code = rest.get(at + 1..at + 4);
        match code.and_then(|c| u8::from_str_radix(c, 8).ok()) {
            Some(byte) => {
                out.push(byte as char);
                rest = &rest[at + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[at + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The smallest limit set at `cgroup` or any ancestor visible in `mount`.
fn limit_along(
    root: &Path,
    mount: &Mount,
    cgroup: &str,
    version: Version,
    controller: Controller,
) -> Option<f64> {
    let top = root.join(mount.mount_point.trim_start_matches('/'));
    // The process's cgroup relative to what the mount shows. A cgroup outside
    // the mounted subtree (a container seeing its own cgroup at the mount
    // point, named by its host path) is the mount point itself.
    let relative = match cgroup.strip_prefix(mount.hierarchy_root.trim_end_matches('/')) {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => rest.trim_start_matches('/'),
        _ => "",
    };
    let mut dir: PathBuf = top.join(relative);
    let mut smallest: Option<f64> = None;
    loop {
        if let Some(limit) = controller.limit_at(&dir, version) {
            smallest = Some(smallest.map_or(limit, |s| s.min(limit)));
        }
        if dir == top || !dir.pop() || !dir.starts_with(&top) {
            break;
        }
    }
    smallest
}

/// A memory limit file's value: bytes, or `None` for "max" (v2) / v1's
/// unlimited.
fn parse_bytes(text: &str) -> Option<u64> {
    let value = text.trim().parse::<u64>().ok()?;
    (value < V1_UNLIMITED).then_some(value)
}

/// CPUs from a CFS quota and period; a negative quota (v1's -1) or v2's
/// "max" (which fails to parse before this) is none.
fn cpus(quota: i64, period: u64) -> Option<f64> {
    (quota > 0 && period > 0).then(|| quota as f64 / period as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    /// A fake host: `/proc/self/{cgroup,mountinfo}` and limit files.
    struct Host(tempfile::TempDir);

    impl Host {
        fn new(cgroup: &str, mountinfo: &str) -> Self {
            let host = Self(tempfile::tempdir().unwrap());
            host.write("proc/self/cgroup", cgroup);
            host.write("proc/self/mountinfo", mountinfo);
            host
        }

        fn write(&self, path: &str, text: &str) {
            let path = self.0.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }

        fn limit(&self) -> Option<u64> {
            memory_limit(self.0.path())
        }

        fn cpus(&self) -> Option<f64> {
            cpu_quota(self.0.path())
        }
    }

    const V2_MOUNT: &str = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n";
    const V1_MOUNTS: &str = "31 23 0:28 / /sys/fs/cgroup ro - tmpfs tmpfs ro,mode=755\n\
        32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu,cpuacct\n\
        35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
    const HYBRID_MOUNTS: &str = "31 23 0:28 / /sys/fs/cgroup ro - tmpfs tmpfs ro,mode=755\n\
        35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n\
        41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";

    #[test]
    fn a_v2_container_at_the_root_of_its_namespace() {
        let host = Host::new("0::/\n", V2_MOUNT);
        host.write("sys/fs/cgroup/memory.max", "3221225472\n");
        assert_eq!(host.limit(), Some(3 * GIB));
        host.write("sys/fs/cgroup/memory.max", "max\n");
        assert_eq!(host.limit(), None);
    }

    #[test]
    fn a_v2_systemd_scope_takes_the_smallest_limit_along_its_path() {
        let host = Host::new("0::/job.slice/run-42.scope\n", V2_MOUNT);
        host.write("sys/fs/cgroup/memory.max", "max\n");
        host.write("sys/fs/cgroup/job.slice/memory.max", "3221225472\n");
        host.write("sys/fs/cgroup/job.slice/run-42.scope/memory.max", "max\n");
        assert_eq!(host.limit(), Some(3 * GIB));
        host.write(
            "sys/fs/cgroup/job.slice/run-42.scope/memory.max",
            "1073741824\n",
        );
        assert_eq!(host.limit(), Some(GIB));
    }

    #[test]
    fn a_v1_slurm_job_is_read_at_its_own_cgroup_not_the_hierarchy_root() {
        let host = Host::new(
            "5:cpu,cpuacct:/slurm/uid_1/job_7\n4:memory:/slurm/uid_1/job_7\n1:name=systemd:/\n",
            V1_MOUNTS,
        );
        host.write(
            "sys/fs/cgroup/memory/memory.limit_in_bytes",
            "9223372036854771712\n",
        );
        host.write(
            "sys/fs/cgroup/memory/slurm/uid_1/job_7/memory.limit_in_bytes",
            "3221225472\n",
        );
        assert_eq!(host.limit(), Some(3 * GIB));
        host.write(
            "sys/fs/cgroup/memory/slurm/memory.limit_in_bytes",
            "2147483648\n",
        );
        assert_eq!(
            host.limit(),
            Some(2 * GIB),
            "a parent's smaller limit binds"
        );
    }

    #[test]
    fn a_hybrid_host_reads_v1_memory_and_the_unified_mount() {
        let host = Host::new(
            "4:memory:/process_api/abc\n1:name=systemd:/\n0::/process_api/abc\n",
            HYBRID_MOUNTS,
        );
        host.write(
            "sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes",
            "4294967296\n",
        );
        assert_eq!(host.limit(), Some(4 * GIB));
        // A memory.max on the unified side (rare on hybrid hosts) binds too.
        host.write(
            "sys/fs/cgroup/unified/process_api/abc/memory.max",
            "3221225472\n",
        );
        assert_eq!(host.limit(), Some(3 * GIB));
    }

    #[test]
    fn a_container_without_a_cgroup_namespace_sees_its_cgroup_at_the_mount_point() {
        // The mount shows the subtree /kubepods/pod1/c1 at /sys/fs/cgroup.
        let host = Host::new(
            "0::/kubepods/pod1/c1\n",
            "30 23 0:26 /kubepods/pod1/c1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
        );
        host.write("sys/fs/cgroup/memory.max", "2147483648\n");
        assert_eq!(host.limit(), Some(2 * GIB));
        // Named by a path outside the mounted subtree: the mount point is it.
        let host = Host::new(
            "0::/other\n",
            "30 23 0:26 /kubepods/pod1/c1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
        );
        host.write("sys/fs/cgroup/memory.max", "2147483648\n");
        assert_eq!(host.limit(), Some(2 * GIB));
    }

    #[test]
    fn a_v2_cpu_quota_is_the_smallest_along_the_path() {
        let host = Host::new("0::/kubepods/pod1/c1\n", V2_MOUNT);
        assert_eq!(host.cpus(), None, "no cpu.max anywhere");
        host.write("sys/fs/cgroup/kubepods/pod1/cpu.max", "max 100000\n");
        assert_eq!(host.cpus(), None);
        host.write("sys/fs/cgroup/kubepods/pod1/c1/cpu.max", "250000 100000\n");
        assert_eq!(host.cpus(), Some(2.5));
        host.write("sys/fs/cgroup/kubepods/cpu.max", "150000 100000\n");
        assert_eq!(host.cpus(), Some(1.5), "a parent's smaller quota binds");
    }

    #[test]
    fn a_v1_cpu_quota_reads_the_cfs_files_of_the_cpu_hierarchy() {
        let host = Host::new(
            "5:cpu,cpuacct:/slurm/uid_1/job_7\n4:memory:/slurm/uid_1/job_7\n1:name=systemd:/\n",
            V1_MOUNTS,
        );
        host.write("sys/fs/cgroup/cpu/cpu.cfs_quota_us", "-1\n");
        host.write("sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n");
        assert_eq!(host.cpus(), None);
        let job = "sys/fs/cgroup/cpu/slurm/uid_1/job_7";
        host.write(&format!("{job}/cpu.cfs_quota_us"), "400000\n");
        host.write(&format!("{job}/cpu.cfs_period_us"), "100000\n");
        assert_eq!(host.cpus(), Some(4.0));
        // The memory hierarchy's files say nothing of CPUs.
        assert_eq!(host.limit(), None);
    }

    #[test]
    fn escaped_mount_points_and_missing_files() {
        let host = Host::new(
            "0::/\n",
            "30 23 0:26 / /sys/fs/cgroup\\040v2 rw - cgroup2 cgroup2 rw\n",
        );
        host.write("sys/fs/cgroup v2/memory.max", "1073741824\n");
        assert_eq!(host.limit(), Some(GIB));
        assert_eq!(Host::new("0::/\n", "").limit(), None);
        assert_eq!(memory_limit(Path::new("/nonexistent-root")), None);
    }
}
