//! TLS between the sidecar and the decode pool's workers, both ends
//! authenticated: each side holds a certificate signed by the pool's CA and
//! accepts only a peer whose certificate that CA signed. The token still
//! travels in every call (a second check, and what names a pool across
//! releases); TLS is what keeps it, the images and the pixels from anyone
//! on the path, and what proves to a sidecar that its answer came from a
//! worker of its pool.
//!
//! The chart issues the CA and one certificate (server and client use)
//! into a Secret, or takes cert-manager's; any PEM files do. Workers are
//! dialled by address (the headless Service resolves to pods' IPs), so the
//! sidecar checks the worker's certificate against one name, the pool's
//! Service name ([`PoolTls::server_name`]), not the address.

use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// A TLS handshake that has not finished in this long ends its connection:
/// a peer cannot hold a connection place by starting one and stalling.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest PEM file read: a CA bundle or a chain is a few KiB.
const MAX_PEM_BYTES: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{flag} {path}: {source}")]
    Read {
        flag: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {message}")]
    Invalid { what: String, message: String },
    #[error("{flag} {path}: no PEM {what} in it")]
    NotPem {
        flag: &'static str,
        path: PathBuf,
        what: &'static str,
    },
    #[error(
        "{what} on {addr} without TLS: pool traffic (the token, the images, the pixels) would \
         cross the network in plain text. Give the pool's TLS files ({flags}), or \
         {plaintext_flag} to accept that"
    )]
    PlaintextOffLoopback {
        what: &'static str,
        addr: String,
        flags: &'static str,
        plaintext_flag: &'static str,
    },
}

/// The files of one end of the pool's TLS, read once at start.
#[derive(Debug, Clone)]
pub struct PoolTls {
    /// The pool's CA, PEM.
    pub ca: Vec<u8>,
    /// This end's certificate chain and key, PEM.
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
    /// The name workers' certificates carry (the pool Service's name).
    pub server_name: String,
}

/// Where the files are, as the flags give them.
#[derive(Debug, Clone)]
pub struct PoolTlsFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub server_name: String,
}

impl PoolTlsFiles {
    /// Reads the files; each flag is named in what goes wrong.
    pub fn load(&self, flags: [&'static str; 3]) -> Result<PoolTls, TlsError> {
        Ok(PoolTls {
            ca: read_pem(flags[0], &self.ca, "CERTIFICATE")?,
            cert: read_pem(flags[1], &self.cert, "CERTIFICATE")?,
            key: read_pem(flags[2], &self.key, "PRIVATE KEY")?,
            server_name: self.server_name.clone(),
        })
    }
}

fn read_pem(flag: &'static str, path: &Path, what: &'static str) -> Result<Vec<u8>, TlsError> {
    let read_error = |source| TlsError::Read {
        flag,
        path: path.to_path_buf(),
        source,
    };
    let mut data = Vec::new();
    std::fs::File::open(path)
        .and_then(|file| std::io::Read::take(file, MAX_PEM_BYTES).read_to_end(&mut data))
        .map_err(read_error)?;
    // "PRIVATE KEY" also matches "RSA PRIVATE KEY" and "EC PRIVATE KEY".
    let found = String::from_utf8_lossy(&data).contains(&format!("{what}-----"));
    if !found {
        return Err(TlsError::NotPem {
            flag,
            path: path.to_path_buf(),
            what,
        });
    }
    Ok(data)
}

impl PoolTls {
    /// The worker's side: its certificate, only clients whose certificate
    /// the pool's CA signed, and HTTP/2 (ALPN `h2`). The worker shakes
    /// hands itself, ahead of its connection places
    /// (`super::handshake::accept_tls`).
    pub fn server_acceptor(&self) -> Result<tokio_rustls::TlsAcceptor, TlsError> {
        use tokio_rustls::rustls;
        use tokio_rustls::rustls::pki_types::pem::PemObject as _;
        use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let invalid = |what: &str, error: String| TlsError::Invalid {
            what: what.to_string(),
            message: error,
        };
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(&self.ca) {
            let ca = ca.map_err(|e| invalid("the pool's CA", e.to_string()))?;
            roots
                .add(ca)
                .map_err(|e| invalid("the pool's CA", e.to_string()))?;
        }
        let chain = CertificateDer::pem_slice_iter(&self.cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid("the worker's certificate", e.to_string()))?;
        let key = PrivateKeyDer::from_pem_slice(&self.key)
            .map_err(|e| invalid("the worker's key", e.to_string()))?;
        let verifier = rustls::server::WebPkiClientVerifier::builder(roots.into())
            .build()
            .map_err(|e| invalid("the pool's CA", e.to_string()))?;
        let mut config = rustls::ServerConfig::builder()
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .map_err(|e| invalid("the worker's certificate and key", e.to_string()))?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config)))
    }

    /// The sidecar's side: the pool's CA alone is trusted (not the
    /// system's roots), the worker's certificate must name the pool, and
    /// the sidecar presents its own.
    pub fn client_config(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca))
            .identity(Identity::from_pem(&self.cert, &self.key))
            .domain_name(self.server_name.clone())
            .timeout(HANDSHAKE_TIMEOUT)
    }
}

/// Plain text is for loopback (one host: tests, a local pool) or an
/// explicit choice, which is logged.
pub fn check_plaintext(
    what: &'static str,
    addrs: &[String],
    (insecure_plaintext, plaintext_flag): (bool, &'static str),
    flags: &'static str,
) -> Result<(), TlsError> {
    let off_loopback = addrs.iter().find(|addr| !is_loopback(addr));
    match off_loopback {
        None => Ok(()),
        Some(addr) if insecure_plaintext => {
            tracing::warn!(
                what,
                addr = addr.as_str(),
                flag = plaintext_flag,
                "pool traffic crosses the network unencrypted and unauthenticated but for its \
                 token"
            );
            Ok(())
        }
        Some(addr) => Err(TlsError::PlaintextOffLoopback {
            what,
            addr: addr.clone(),
            flags,
            plaintext_flag,
        }),
    }
}

/// Whether `addr` (an address or `host:port`) is this host's loopback.
fn is_loopback(addr: &str) -> bool {
    if let Ok(socket) = addr.parse::<SocketAddr>() {
        return socket.ip().is_loopback();
    }
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    host == "localhost"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_only_on_loopback_or_when_asked() {
        let flags = "--tls-ca, --tls-cert, --tls-key";
        let (no, yes) = ((false, "--x-plaintext"), (true, "--x-plaintext"));
        let local = ["127.0.0.1:50061".to_string(), "localhost:1".into()];
        assert!(check_plaintext("pool worker", &local, no, flags).is_ok());
        assert!(check_plaintext("pool worker", &["[::1]:5".into()], no, flags).is_ok());
        let remote = ["pool.ns.svc:50061".to_string()];
        let error = check_plaintext("pool worker", &remote, no, flags).unwrap_err();
        assert!(error.to_string().contains("or --x-plaintext"), "{error}");
        assert!(check_plaintext("pool worker", &remote, yes, flags).is_ok());
        assert!(check_plaintext("x", &["0.0.0.0:50061".into()], no, flags).is_err());
    }

    #[test]
    fn files_that_are_not_pem_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk");
        std::fs::write(&junk, b"not a certificate").unwrap();
        let files = PoolTlsFiles {
            ca: junk.clone(),
            cert: junk.clone(),
            key: junk,
            server_name: "pool".into(),
        };
        let error = files
            .load(["--tls-ca", "--tls-cert", "--tls-key"])
            .unwrap_err();
        assert!(error.to_string().starts_with("--tls-ca "), "{error}");
        let missing = PoolTlsFiles {
            ca: dir.path().join("absent"),
            ..files
        };
        let error = missing
            .load(["--tls-ca", "--tls-cert", "--tls-key"])
            .unwrap_err();
        assert!(matches!(error, TlsError::Read { .. }), "{error}");
    }
}
