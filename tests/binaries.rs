//! The two binaries the demo runs, built as the tests build them: both start
//! and say who they are. (`hack/demo.sh` builds them through this target, so
//! that `hack/test.sh` afterwards reuses their dependencies.)

// Tests may unwrap, expect and panic: Cargo.toml's deny is for the product.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

fn first_line(binary: &str, arg: &str) -> String {
    let out = Command::new(binary)
        .arg(arg)
        .output()
        .expect("run the binary");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{binary} {arg}: {:?}\n{text}",
        out.status
    );
    text.lines().next().unwrap_or_default().to_string()
}

#[test]
fn the_attacher_and_the_mock_driver_start() {
    let attacher = first_line(env!("CARGO_BIN_EXE_csi-attacher"), "--version");
    assert!(attacher.contains("csi-attacher"), "{attacher}");
    let mock = first_line(env!("CARGO_BIN_EXE_csi-mock-driver"), "--help");
    assert!(!mock.is_empty());
}
