//! How a unit reaches a worker. The sidecar speaks gRPC ([`GrpcConnector`]);
//! the pool simulation ([`super::sim`]) plugs in a model of workers in
//! virtual time, so the dispatch code it drives is the sidecar's own.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use super::wire::{self, pb};
use crate::net::tls::PoolTls;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// One worker, as the dispatch sees it: a unit in, its answer or a status
/// out.
pub trait WorkerLink: Send + Sync {
    fn decode(
        &self,
        unit: pb::DecodeUnit,
        identity: &str,
        token: &str,
    ) -> BoxFuture<'static, Result<pb::DecodedUnit, tonic::Status>>;
}

/// Makes the link to a worker address when it joins the membership.
pub trait Connector: Send + Sync {
    fn connect(&self, addr: SocketAddr) -> Option<Arc<dyn WorkerLink>>;
}

/// gRPC over a lazily connected HTTP/2 channel per worker, in TLS where
/// the pool has it.
#[derive(Debug, Default, Clone)]
pub struct GrpcConnector {
    tls: Option<ClientTlsConfig>,
}

impl GrpcConnector {
    pub fn new(tls: Option<&PoolTls>) -> Self {
        Self {
            tls: tls.map(PoolTls::client_config),
        }
    }
}

struct GrpcLink {
    client: pb::decode_pool_client::DecodePoolClient<Channel>,
}

impl Connector for GrpcConnector {
    fn connect(&self, addr: SocketAddr) -> Option<Arc<dyn WorkerLink>> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}")).ok()?;
        if let Some(tls) = &self.tls {
            endpoint = match endpoint.tls_config(tls.clone()) {
                Ok(endpoint) => endpoint,
                Err(error) => {
                    tracing::error!(worker = %addr, %error, "pool TLS settings refused");
                    return None;
                }
            };
        }
        let endpoint = endpoint
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            // An answer is megabytes: HTTP/2's default 64 KiB window would
            // cost a round trip (and a wake-up on each side) per 64 KiB.
            .initial_stream_window_size(super::transport::STREAM_WINDOW_BYTES)
            .initial_connection_window_size(super::transport::CONNECTION_WINDOW_BYTES)
            .max_frame_size(super::transport::MAX_FRAME_BYTES)
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(10));
        Some(Arc::new(GrpcLink {
            client: pb::decode_pool_client::DecodePoolClient::new(endpoint.connect_lazy()),
        }))
    }
}

impl WorkerLink for GrpcLink {
    fn decode(
        &self,
        unit: pb::DecodeUnit,
        identity: &str,
        token: &str,
    ) -> BoxFuture<'static, Result<pb::DecodedUnit, tonic::Status>> {
        // No answer longer than this unit's can be is read at all.
        let bound = wire::output_from_wire(&unit)
            .map(|output| wire::answer_bound(unit.samples.len(), &output))
            .map_err(|error| tonic::Status::internal(error.to_string()));
        let mut request = tonic::Request::new(unit);
        let metadata = request.metadata_mut();
        let headers = format!("Bearer {token}")
            .parse()
            .map_err(|_| tonic::Status::internal("the token is not a valid header value"))
            .and_then(|bearer| {
                metadata.insert("authorization", bearer);
                identity
                    .parse()
                    .map_err(|_| tonic::Status::internal("the build is not a valid header value"))
            })
            .map(|build| {
                metadata.insert(wire::BUILD_HEADER, build);
            });
        let client = self.client.clone();
        Box::pin(async move {
            headers?;
            let mut client = client.max_decoding_message_size(bound?);
            Ok(client.decode(request).await?.into_inner())
        })
    }
}
