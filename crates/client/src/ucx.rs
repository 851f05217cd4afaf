//! The client's UCX data plane (`TransportKind::Ucx`): one-sided transfers
//! to nodes that serve UCX, with routes from the master (rdma role only),
//! and TCP to everything else.

use crate::ClientConfig;
use std::sync::Arc;
use strata_common::grpc::MasterChannel;
use strata_common::Result;
use strata_proto::master_client::MasterClient;
use strata_transport::tcp::TcpTransport;
use strata_transport::Transport;

#[cfg(feature = "ucx")]
pub(crate) fn transport(
    cfg: &ClientConfig,
    master: MasterClient<MasterChannel>,
    tcp: Arc<TcpTransport>,
) -> Result<Arc<dyn Transport>> {
    use strata_transport::ucx::{UcxClientConfig, UcxTransport};
    let ucx = UcxClientConfig {
        timeout: cfg.transport.io_timeout,
        ..Default::default()
    };
    Ok(Arc::new(UcxTransport::new(
        ucx,
        tcp,
        Arc::new(MasterRoutes(master)),
    )?))
}

#[cfg(not(feature = "ucx"))]
pub(crate) fn transport(
    _: &ClientConfig,
    _: MasterClient<MasterChannel>,
    _: Arc<TcpTransport>,
) -> Result<Arc<dyn Transport>> {
    Err(strata_common::Error::invalid(
        "this build of the Strata client has no UCX (cargo feature `ucx`); use the tcp transport",
    ))
}

/// Routes from the master's `GetUcxRoutes`.
#[cfg(feature = "ucx")]
struct MasterRoutes(MasterClient<MasterChannel>);

#[cfg(feature = "ucx")]
impl strata_transport::ucx::RouteSource for MasterRoutes {
    fn routes(
        &self,
        segment_ids: Vec<u64>,
    ) -> futures::future::BoxFuture<'_, Result<Vec<strata_proto::UcxRoute>>> {
        let mut m = self.0.clone();
        Box::pin(async move {
            let r = m
                .get_ucx_routes(strata_proto::GetUcxRoutesRequest { segment_ids })
                .await
                .map_err(strata_common::Error::from)?;
            Ok(r.into_inner().routes)
        })
    }
}
