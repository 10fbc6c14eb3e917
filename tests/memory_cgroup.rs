//! The memory budget comes from this process's own cgroup, not the top of
//! the cgroup mount: the real binary started inside a memory cgroup made for
//! the test (where the test may make one: root, a writable cgroup mount).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const LIMIT: u64 = 3 << 30;

/// This process's memory cgroup directory: cgroup v1's `memory` hierarchy
/// or the v2 unified one, as mounted on common hosts.
fn own_memory_cgroup() -> Option<(PathBuf, &'static str)> {
    let membership = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    for line in membership.lines() {
        let mut fields = line.splitn(3, ':');
        let (id, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        let path = path.trim_start_matches('/');
        if controllers.split(',').any(|c| c == "memory") {
            let dir = Path::new("/sys/fs/cgroup/memory").join(path);
            if dir.join("memory.limit_in_bytes").exists() {
                return Some((dir, "memory.limit_in_bytes"));
            }
        } else if id == "0" && controllers.is_empty() {
            let dir = Path::new("/sys/fs/cgroup").join(path);
            if dir.join("cgroup.controllers").exists()
                && std::fs::read_to_string(dir.join("cgroup.subtree_control"))
                    .is_ok_and(|c| c.contains("memory"))
            {
                return Some((dir, "memory.max"));
            }
        }
    }
    None
}

/// A child memory cgroup, removed when dropped.
struct TestCgroup(PathBuf);

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // The process inside has exited; an empty cgroup can be removed.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn the_budget_is_planned_from_the_process_own_memory_cgroup() {
    let Some((parent, limit_file)) = own_memory_cgroup() else {
        println!("skipped: no memory cgroup this test can see");
        return;
    };
    let dir = parent.join(format!("shardfeed-test-{}", std::process::id()));
    if std::fs::create_dir(&dir).is_err() {
        println!(
            "skipped: cannot create a memory cgroup under {}",
            parent.display()
        );
        return;
    }
    let cgroup = TestCgroup(dir);
    std::fs::write(cgroup.0.join(limit_file), LIMIT.to_string()).unwrap();

    let socket_dir = tempfile::tempdir().unwrap();
    let procs = cgroup.0.join("cgroup.procs");
    let mut server = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > '{}' && exec '{}' serve --listen 'unix:{}/s.sock' \
             --metrics-listen 127.0.0.1:0 --log-format json",
            procs.display(),
            env!("CARGO_BIN_EXE_shardfeed"),
            socket_dir.path().display()
        ))
        .env_remove("SHARDFEED_MEMORY_LIMIT")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stderr.take().unwrap()).lines();
    let deadline = Instant::now() + Duration::from_secs(60);
    let serving = loop {
        assert!(
            Instant::now() < deadline,
            "the server never said it was serving"
        );
        match lines.next() {
            Some(Ok(line)) if line.contains("shardfeed serving") => break line,
            Some(_) => continue,
            None => panic!("the server exited: {:?}", server.wait()),
        }
    };
    let _ = server.kill();
    let _ = server.wait();
    let line: serde_json::Value = serde_json::from_str(&serving).unwrap();
    let budget = line["fields"]["stream_memory_mib"]
        .as_u64()
        .unwrap_or_else(|| panic!("no stream budget in {serving}"));
    // 3 GiB: streams get 3/4 less the decode scratch (min(limit/8, 1 GiB)).
    let expected = (LIMIT * 3 / 4 - LIMIT / 8) >> 20;
    println!("{serving}");
    assert_eq!(budget, expected, "{serving}");
}
