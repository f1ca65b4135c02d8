//! A blocking CSI client over the plugin's Unix socket, for tests and tools that are not
//! async themselves: it owns a small tokio runtime and calls through the generated tonic
//! clients. A failed call is the plugin's [`Status`], boxed.

use std::path::Path;

use tonic::Status;
use tonic::transport::Channel;

use crate::error::{Error, Result};
use crate::proto::identity_client::IdentityClient;
use crate::proto::node_client::NodeClient;
use crate::proto::*;

/// The Identity and Node services of one plugin, called synchronously.
#[derive(Debug)]
pub struct Client {
    rt: tokio::runtime::Runtime,
    identity: IdentityClient<Channel>,
    node: NodeClient<Channel>,
}

macro_rules! calls {
    ($($(#[$doc:meta])* $name:ident($field:ident): $req:ty => $resp:ty;)*) => {$(
        $(#[$doc])*
        pub fn $name(&mut self, request: $req) -> std::result::Result<$resp, Box<Status>> {
            let c = &mut self.$field;
            self.rt
                .block_on(c.$name(request))
                .map(tonic::Response::into_inner)
                .map_err(Box::new)
        }
    )*};
}

impl Client {
    /// Connects to the plugin listening on the socket `path`.
    pub fn connect(path: &Path) -> Result<Client> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::Internal(format!("cannot start a runtime: {e}")))?;
        let (identity, node) = rt.block_on(crate::server::clients(path))?;
        Ok(Client { rt, identity, node })
    }

    calls! {
        /// GetPluginInfo.
        get_plugin_info(identity): GetPluginInfoRequest => GetPluginInfoResponse;
        /// Probe.
        probe(identity): ProbeRequest => ProbeResponse;
        /// GetPluginCapabilities.
        get_plugin_capabilities(identity): GetPluginCapabilitiesRequest => GetPluginCapabilitiesResponse;
        /// NodeGetInfo.
        node_get_info(node): NodeGetInfoRequest => NodeGetInfoResponse;
        /// NodeGetCapabilities.
        node_get_capabilities(node): NodeGetCapabilitiesRequest => NodeGetCapabilitiesResponse;
        /// NodeStageVolume.
        node_stage_volume(node): NodeStageVolumeRequest => NodeStageVolumeResponse;
        /// NodeUnstageVolume.
        node_unstage_volume(node): NodeUnstageVolumeRequest => NodeUnstageVolumeResponse;
        /// NodePublishVolume.
        node_publish_volume(node): NodePublishVolumeRequest => NodePublishVolumeResponse;
        /// NodeUnpublishVolume.
        node_unpublish_volume(node): NodeUnpublishVolumeRequest => NodeUnpublishVolumeResponse;
        /// NodeGetVolumeStats.
        node_get_volume_stats(node): NodeGetVolumeStatsRequest => NodeGetVolumeStatsResponse;
        /// NodeExpandVolume.
        node_expand_volume(node): NodeExpandVolumeRequest => NodeExpandVolumeResponse;
    }
}
