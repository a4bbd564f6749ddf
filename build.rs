//! Compiles `proto/csi.proto` with a pure-Rust protobuf compiler (protox), so
//! building needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/csi.proto");
    let descriptors = protox::compile(["proto/csi.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Requests that carry secrets get a hand-written Debug that redacts them
        // (src/csi/proto.rs): a derived Debug would print the secrets map.
        .skip_debug([
            "csi.v1.ControllerPublishVolumeRequest",
            "csi.v1.ControllerUnpublishVolumeRequest",
        ])
        .compile_fds(descriptors)?;
    Ok(())
}
