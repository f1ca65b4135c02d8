//! Generates the gRPC service code (server traits and clients) of the two CSI 1.x services this
//! plugin serves, Identity and Node, with `tonic_build::manual`: the messages are hand-written
//! prost structs in `src/proto.rs`, so neither protoc nor a `.proto` file is needed to build.

use tonic_build::manual::{Builder, Method, Service};

/// One unary RPC: `rust_name` in the trait, `Route` on the wire, `crate::proto::RouteRequest`
/// in and `crate::proto::RouteResponse` out.
fn unary(rust_name: &str, route: &str) -> Method {
    Method::builder()
        .name(rust_name)
        .route_name(route)
        .input_type(format!("crate::proto::{route}Request"))
        .output_type(format!("crate::proto::{route}Response"))
        .codec_path("tonic::codec::ProstCodec")
        .build()
}

fn main() {
    let identity = Service::builder()
        .name("Identity")
        .package("csi.v1")
        .method(unary("get_plugin_info", "GetPluginInfo"))
        .method(unary("get_plugin_capabilities", "GetPluginCapabilities"))
        .method(unary("probe", "Probe"))
        .build();
    let node = Service::builder()
        .name("Node")
        .package("csi.v1")
        .method(unary("node_stage_volume", "NodeStageVolume"))
        .method(unary("node_unstage_volume", "NodeUnstageVolume"))
        .method(unary("node_publish_volume", "NodePublishVolume"))
        .method(unary("node_unpublish_volume", "NodeUnpublishVolume"))
        .method(unary("node_get_volume_stats", "NodeGetVolumeStats"))
        .method(unary("node_expand_volume", "NodeExpandVolume"))
        .method(unary("node_get_capabilities", "NodeGetCapabilities"))
        .method(unary("node_get_info", "NodeGetInfo"))
        .build();
    Builder::new().compile(&[identity, node]);
    println!("cargo::rerun-if-changed=build.rs");
}
