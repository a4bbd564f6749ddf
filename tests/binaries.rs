//! The attacher, built as the tests build it, starts and says who it is.
//! (`hack/demo.sh` builds the two binaries it runs through the workspace's
//! `binaries` targets, this one and tools/csi-mock-driver's, so that
//! `hack/test.sh` afterwards reuses their dependencies.)

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
fn the_attacher_starts() {
    let attacher = first_line(env!("CARGO_BIN_EXE_csi-attacher"), "--version");
    assert!(attacher.contains("csi-attacher"), "{attacher}");
}
