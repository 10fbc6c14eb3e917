//! Files opened beneath a directory held open: whoever can write into the
//! directory (a cache folder on a shared volume, a dataset folder) cannot
//! steer an open outside it by swapping a component for a symlink between a
//! check and the open, nor make a read hang or grow without bound by
//! leaving a FIFO, a device or a huge file where a record is expected.
//!
//! The directory is resolved once, when [`Beneath::open`] takes its
//! descriptor; every later open resolves relative to that descriptor
//! (`openat2` with `RESOLVE_BENEATH`, Linux 5.6+). Where links inside are
//! allowed, an absolute link (which `RESOLVE_BENEATH` refuses) or a kernel
//! without `openat2` gets an open that follows links and a check of where
//! the opened descriptor really is. Where no links are allowed and the
//! kernel lacks `openat2`, each component is opened with `O_NOFOLLOW`.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// What a path inside the directory may resolve through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links {
    /// Symlinks that stay inside the directory are followed.
    Inside,
    /// No symlink anywhere on the path.
    None,
}

/// A directory, resolved once and held open.
#[derive(Debug)]
pub struct Beneath {
    dir: OwnedFd,
    /// The path it was opened by, for messages.
    path: PathBuf,
}

impl Beneath {
    pub fn open(path: &Path) -> io::Result<Self> {
        let name = c_path(path)?;
        // SAFETY: a NUL-terminated path and valid flags; the result is checked.
        let fd = unsafe {
            libc::open(
                name.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            // SAFETY: a fresh descriptor nobody else owns.
            dir: unsafe { OwnedFd::from_raw_fd(fd) },
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A path that reaches the directory through its descriptor, for the
    /// calls that take a path (listing, writing): whatever its original
    /// path points at now, this is the directory that was opened.
    pub fn fd_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.dir.as_raw_fd()))
    }

    /// Where the directory resolves now, as the kernel sees the descriptor
    /// (not the path it was opened by, which may have been repointed since).
    pub fn resolved(&self) -> io::Result<PathBuf> {
        std::fs::read_link(format!("/proc/self/fd/{}", self.dir.as_raw_fd()))
    }

    /// Opens `relative` for reading. Absolute paths and `..` are refused
    /// before the kernel sees them; `links` says which symlinks may be
    /// followed. Opened non-blocking, so a FIFO cannot hang the open.
    pub fn open_read(&self, relative: &Path, links: Links) -> io::Result<File> {
        if relative.is_absolute()
            || relative
                .components()
                .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "the path leaves its directory",
            ));
        }
        let flags = libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY;
        let fd = match openat2(self.dir.as_raw_fd(), relative, flags, links) {
            Err(error) if matches!(error.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) => {
                match links {
                    Links::None => open_without_links(self.dir.as_raw_fd(), relative, flags)?,
                    Links::Inside => self.open_checked(relative, flags)?,
                }
            }
            // RESOLVE_BENEATH refuses every absolute link, even one to a
            // file inside (a class folder linked by its full path).
            Err(error) if links == Links::Inside && error.raw_os_error() == Some(libc::EXDEV) => {
                self.open_checked(relative, flags)?
            }
            opened => opened?,
        };
        Ok(File::from(fd))
    }

    /// Opens `relative` following its links, then checks where the file
    /// opened really is: inside the directory, or refused (`EXDEV`). The
    /// check is of the descriptor, so a link swapped during the open
    /// cannot pass it.
    fn open_checked(&self, relative: &Path, flags: i32) -> io::Result<OwnedFd> {
        let fd = openat(self.dir.as_raw_fd(), relative, flags)?;
        let opened = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
        if !opened.starts_with(self.resolved()?) {
            return Err(io::Error::from_raw_os_error(libc::EXDEV));
        }
        Ok(fd)
    }
}

/// Reads the whole of `file`, which must be a regular file of at most
/// `limit` bytes: a device or a FIFO left where a file is expected is an
/// error, not an endless read.
pub fn read_regular(file: &mut File, limit: u64) -> io::Result<Vec<u8>> {
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a regular file",
        ));
    }
    if meta.len() > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} bytes, over the bound of {limit}", meta.len()),
        ));
    }
    let mut data = Vec::with_capacity(meta.len() as usize);
    // A file that grows while it is read stops at the bound all the same.
    file.take(limit + 1).read_to_end(&mut data)?;
    if data.len() as u64 > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("grew past the bound of {limit} bytes while read"),
        ));
    }
    Ok(data)
}

/// Whether `error` is the kernel refusing a symlink on the path.
pub fn is_link_refused(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::ELOOP | libc::EXDEV))
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the path"))
}

fn openat2(dir: RawFd, relative: &Path, flags: i32, links: Links) -> io::Result<OwnedFd> {
    let name = c_path(relative)?;
    let mut resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    if links == Links::None {
        resolve |= libc::RESOLVE_NO_SYMLINKS;
    }
    // SAFETY: an all-zero open_how is valid; its fields are set below.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = flags as u64;
    how.resolve = resolve;
    // SAFETY: a NUL-terminated path, a valid open_how and its size.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir,
            name.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `openat2`'s stand-in: every component opened with `O_NOFOLLOW`.
fn open_without_links(dir: RawFd, relative: &Path, flags: i32) -> io::Result<OwnedFd> {
    let parts: Vec<&std::ffi::OsStr> = relative
        .components()
        .filter_map(|c| match c {
            Component::Normal(part) => Some(part),
            _ => None,
        })
        .collect();
    let Some((last, folders)) = parts.split_last() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "an empty path"));
    };
    let mut held: Option<OwnedFd> = None;
    for folder in folders {
        let at = held.as_ref().map_or(dir, AsRawFd::as_raw_fd);
        held = Some(openat(
            at,
            Path::new(folder),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )?);
    }
    let at = held.as_ref().map_or(dir, AsRawFd::as_raw_fd);
    openat(at, Path::new(last), flags | libc::O_NOFOLLOW)
}

fn openat(dir: RawFd, name: &Path, flags: i32) -> io::Result<OwnedFd> {
    let name = c_path(name)?;
    // SAFETY: a NUL-terminated name and valid flags; the result is checked.
    let fd = unsafe { libc::openat(dir, name.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_out_fifos_and_oversized_files_are_refused() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"outside").unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("ab")).unwrap();
        std::fs::write(dir.path().join("ab/record"), b"inside").unwrap();
        std::os::unix::fs::symlink("record", dir.path().join("ab/alias")).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("cd")).unwrap();
        std::os::unix::fs::symlink("/dev/zero", dir.path().join("ab/zero")).unwrap();
        let fifo = c_path(&dir.path().join("ab/fifo")).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let beneath = Beneath::open(dir.path()).unwrap();
        let read = |path: &str, links: Links| {
            beneath
                .open_read(Path::new(path), links)
                .and_then(|mut file| read_regular(&mut file, 1024))
        };

        assert_eq!(read("ab/record", Links::None).unwrap(), b"inside");
        assert_eq!(read("ab/alias", Links::Inside).unwrap(), b"inside");
        // A link inside by its full path is inside too.
        std::os::unix::fs::symlink(dir.path().join("ab/record"), dir.path().join("full")).unwrap();
        assert_eq!(read("full", Links::Inside).unwrap(), b"inside");
        assert!(read("full", Links::None).is_err());
        // One by its full path to a file outside is not.
        std::os::unix::fs::symlink(outside.path().join("secret"), dir.path().join("out")).unwrap();
        let error = read("out", Links::Inside).unwrap_err();
        assert!(is_link_refused(&error), "{error}");
        let error = read("ab/alias", Links::None).unwrap_err();
        assert!(is_link_refused(&error), "{error}");
        for links in [Links::Inside, Links::None] {
            // A folder swapped for a link out, and a link to a device.
            assert!(read("cd/secret", links).is_err(), "{links:?}");
            assert!(read("ab/zero", links).is_err(), "{links:?}");
            assert!(read("../secret", links).is_err());
        }
        // A FIFO neither hangs the open nor the read.
        let error = read("ab/fifo", Links::None).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{error}");
        std::fs::write(dir.path().join("ab/big"), vec![0u8; 2048]).unwrap();
        let error = read("ab/big", Links::None).unwrap_err();
        assert!(error.to_string().contains("over the bound"), "{error}");
        // The fallback for kernels without openat2 refuses links too.
        let fd = open_without_links(
            beneath.dir.as_raw_fd(),
            Path::new("ab/record"),
            libc::O_RDONLY,
        );
        assert!(fd.is_ok());
        assert!(open_without_links(beneath.dir.as_raw_fd(), Path::new("cd/secret"), 0).is_err());
        assert!(open_without_links(beneath.dir.as_raw_fd(), Path::new("ab/alias"), 0).is_err());
    }
}
