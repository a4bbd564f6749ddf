//! The mock driver's binary starts. Its being here also makes `cargo test
//! --workspace` build the binary itself (a package's integration tests get
//! its binaries), in `target/<profile>/`, where the product's behaviour tests
//! and the benchmark find it (tests/support/mock.rs).

use std::process::Command;

#[test]
fn the_mock_driver_starts() {
    let out = Command::new(env!("CARGO_BIN_EXE_csi-mock-driver"))
        .arg("--help")
        .output()
        .expect("run csi-mock-driver --help");
    assert!(out.status.success(), "{out:?}");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("--profile"), "{help}");
}
