//! What every listener of the process shares, below the services that use
//! it: each listener's bounds in one record it is configured from and
//! publishes ([`bounds`]), bounds on a listener's connections
//! ([`connections`], and per address where anyone may connect: [`peers`])
//! and on each call's request ([`requests`]), the metrics
//! endpoint behind them ([`metrics_listener`]), and the decode pool's TLS
//! ([`tls`]) with its handshakes bounded apart ([`handshake`]).

pub mod bounds;
pub mod connections;
pub mod handshake;
pub mod metrics_listener;
pub mod peers;
pub mod places;
pub(crate) mod refusals;
pub mod requests;
pub mod tls;

/// `AsyncWrite` for a connection wrapper `$wrapper<S>` that passes every
/// write to its field `$inner` unchanged (the wrappers here act on what a
/// client sends, never on what the server writes).
macro_rules! delegate_async_write {
    ($wrapper:ident, $inner:ident) => {
        impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for $wrapper<S> {
            fn poll_write(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.get_mut().$inner).poll_write(cx, buf)
            }

            fn poll_write_vectored(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                bufs: &[std::io::IoSlice<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.get_mut().$inner).poll_write_vectored(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                self.$inner.is_write_vectored()
            }

            fn poll_flush(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.get_mut().$inner).poll_flush(cx)
            }

            fn poll_shutdown(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.get_mut().$inner).poll_shutdown(cx)
            }
        }
    };
}
pub(crate) use delegate_async_write;
