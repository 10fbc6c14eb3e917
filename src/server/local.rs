//! The in-process server of the demo, the benchmarks and the tests: the
//! production listener and service on a local address, with a stop that
//! returns once everything the engine held is released.

use std::time::Duration;

use super::client::connect;
use super::listen::{serve, ListenAddr, Listener, ServeError};
use super::pb;
use super::service::{EngineDropped, ShardfeedService};

/// A server on a local listener, run in this process: the one in-process
/// server of the demo, the benchmarks and the tests.
pub struct LocalServer {
    pub addr: ListenAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), ServeError>>,
    /// Ends once the last holder of the service's engine has dropped it.
    engine_dropped: EngineDropped,
}

/// How long [`LocalServer::stop`] waits, after the server has finished, for
/// the streams' last tasks to let go of the engine.
pub const ENGINE_RELEASE_WAIT: Duration = Duration::from_secs(10);

impl LocalServer {
    /// On an ephemeral loopback port, with a one-second drain: the in-process
    /// server the demo and the benchmarks stream through.
    pub async fn loopback(service: ShardfeedService) -> Result<Self, ServeError> {
        Self::start(
            service,
            &ListenAddr::Tcp(([127, 0, 0, 1], 0).into()),
            Duration::from_secs(1),
        )
        .await
    }

    pub async fn start(
        service: ShardfeedService,
        listen: &ListenAddr,
        grace: Duration,
    ) -> Result<Self, ServeError> {
        let listener = Listener::bind(listen).await?;
        let addr = listener.local_addr();
        let engine_dropped = service.engine_dropped();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve(
            listener,
            service,
            std::future::ready(Ok(())),
            async move {
                let _ = stopped.await;
            },
            grace,
        ));
        Ok(Self {
            addr,
            stop: Some(stop),
            task,
            engine_dropped,
        })
    }

    /// A client with message limits raised for whole batches.
    pub async fn client(
        &self,
    ) -> Result<
        pb::shardfeed_client::ShardfeedClient<tonic::transport::Channel>,
        tonic::transport::Error,
    > {
        Ok(
            pb::shardfeed_client::ShardfeedClient::new(connect(&self.addr).await?)
                .max_decoding_message_size(usize::MAX),
        )
    }

    /// Starts shutdown (as SIGTERM would) without waiting for it.
    pub fn begin_shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Shuts down (draining) and waits for the server to finish and for
    /// every task to drop the engine, so that what it holds (the disk
    /// cache and its lock, the tier, the decode pool) is released when this
    /// returns: a test may reopen the cache at once.
    pub async fn stop(mut self) -> Result<(), ServeError> {
        self.begin_shutdown();
        let served = (&mut self.task)
            .await
            .map_err(|e| ServeError::Io(std::io::Error::other(e)))?;
        if tokio::time::timeout(ENGINE_RELEASE_WAIT, self.engine_dropped.wait())
            .await
            .is_err()
        {
            return Err(ServeError::Io(std::io::Error::other(format!(
                "the engine was still held {}s after the server stopped",
                ENGINE_RELEASE_WAIT.as_secs()
            ))));
        }
        served
    }
}
