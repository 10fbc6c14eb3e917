//! Client helpers: a channel to a shardfeed server over TCP or a Unix
//! socket, and the health check the `health` subcommand and probes run.

use tonic::Status;

use super::listen::ListenAddr;

/// A client channel to a shardfeed server, over TCP or a Unix socket.
pub async fn connect(
    addr: &ListenAddr,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    use tonic::transport::Endpoint;
    match addr {
        ListenAddr::Tcp(socket) => {
            Endpoint::from_shared(format!("http://{socket}"))?
                .connect()
                .await
        }
        ListenAddr::Unix(path) => {
            let path = path.clone();
            // The authority is unused over a Unix socket but must be valid.
            Endpoint::from_static("http://localhost")
                .connect_with_connector(tower::service_fn(move |_| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                            tokio::net::UnixStream::connect(path).await?,
                        ))
                    }
                }))
                .await
        }
    }
}

/// Asks the server's `grpc.health.v1` service whether it is serving.
pub async fn check_health(addr: &ListenAddr) -> Result<bool, Status> {
    use tonic_health::pb::health_check_response::ServingStatus;
    let channel = connect(addr)
        .await
        .map_err(|e| Status::unavailable(format!("cannot connect to {addr}: {e}")))?;
    let response = tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await?
        .into_inner();
    Ok(response.status == ServingStatus::Serving as i32)
}
