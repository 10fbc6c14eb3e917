//! The process's signals: SIGTERM and SIGINT start a graceful shutdown (a
//! second one exits at once), and `--exit-with-parent` arms SIGTERM for
//! when the parent dies.

use super::values::CliError;

/// Resolves on the first SIGTERM or SIGINT; a second one exits at once.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers, never start shutdown from here.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::warn!("second signal: exiting now");
        std::process::exit(1);
    });
}

/// Has the kernel send SIGTERM (the graceful shutdown) when the parent
/// exits, however it exits; fails if `parent` is already gone.
pub fn exit_with_parent(parent: u32) -> Result<(), CliError> {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes plain integers and touches no memory.
    let set = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong) };
    if set != 0 {
        return Err(format!(
            "prctl(PR_SET_PDEATHSIG): {}",
            std::io::Error::last_os_error()
        )
        .into());
    }
    // The parent may have exited before the signal was armed.
    // SAFETY: getppid has no preconditions.
    let current = unsafe { libc::getppid() };
    if current as u32 != parent {
        return Err(format!("--exit-with-parent {parent}: that process has already exited").into());
    }
    Ok(())
}
