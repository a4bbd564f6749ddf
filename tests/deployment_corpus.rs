//! Deployment corpus: the csi-attacher containers of public manifests and Helm
//! charts (`tests/corpus/*.yaml`), run with their own args and env against the
//! control plane and the mock driver, the way a kubelet would start them
//! (the runner and what it checks: `support/corpus.rs`).
//!
//! `ours::*` runs this project's binary, `upstream::*` the pinned Go
//! external-attacher on the same fixture: what upstream passes, ours must.

use crate::support;

use std::collections::HashMap;

use support::corpus::{
    corpus_dir, expand, last_bool, last_value, load, rewrite_flag, run_fixture, Binary, Driver,
};
use support::env::Env;
use support::objects::pv;
use support::unique;

/// Runs fixture `file` with `binary` against a mock driver of its own.
async fn run(file: &str, binary: Binary) {
    let env = Env::without_attacher(&[]).await;
    let node = unique("node");
    let driver = Driver {
        socket: &env.mock.socket,
        name: &env.driver,
        node_id: format!("{node}-id"),
        node,
        volume: pv(&unique("pv"), &env.driver),
    };
    run_fixture(file, binary, driver).await;
}

macro_rules! corpus {
    ($($test:ident => $file:literal,)*) => {
        const FILES: &[&str] = &[$($file),*];

        /// This project's binary on each fixture.
        mod ours {
            use crate::support::corpus::Binary;
            $(
                #[tokio::test]
                async fn $test() {
                    super::run($file, Binary::Ours).await;
                }
            )*
        }

        /// Upstream's binary on each fixture: the fixtures and checks are right.
        mod upstream {
            use crate::support::corpus::Binary;
            $(
                #[tokio::test]
                async fn $test() {
                    super::run($file, Binary::Upstream).await;
                }
            )*
        }
    };
}

corpus! {
    external_attacher_example => "external-attacher-example.yaml",
    csi_driver_host_path => "csi-driver-host-path.yaml",
    aws_ebs_chart_defaults => "aws-ebs-chart-defaults.yaml",
    aws_ebs_chart_metrics => "aws-ebs-chart-metrics.yaml",
    aws_ebs_chart_additional_args => "aws-ebs-chart-additional-args.yaml",
    azuredisk_deploy => "azuredisk-deploy.yaml",
    gcp_pd_stable_master => "gcp-pd-stable-master.yaml",
}

#[test]
fn every_fixture_in_the_corpus_has_a_test() {
    let mut on_disk: Vec<String> = std::fs::read_dir(corpus_dir())
        .expect("tests/corpus")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = FILES.iter().map(|f| f.to_string()).collect();
    listed.sort();
    assert_eq!(on_disk, listed);
    for file in FILES {
        let fixture = load(file);
        assert_eq!(fixture.container.name, "csi-attacher", "{file}");
        assert!(
            !fixture.source.repo.is_empty() && !fixture.source.version.is_empty(),
            "{file}: source"
        );
    }
}

#[test]
fn expansion_follows_the_kubernetes_rules() {
    let vars: HashMap<String, String> = [("A", "x"), ("EMPTY", "")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let cases = [
        ("--csi-address=$(A)", "--csi-address=x"),
        ("$(A)$(A)", "xx"),
        ("[$(EMPTY)]", "[]"),
        ("$(UNSET)", "$(UNSET)"),
        ("$$(A)", "$(A)"),
        ("$$$(A)", "$x"),
        ("$$", "$"),
        ("$(A", "$(A"),
        ("a$b", "a$b"),
        ("end$", "end$"),
        ("$", "$"),
        ("é$(A)é", "éxé"),
        ("", ""),
    ];
    for (input, want) in cases {
        assert_eq!(expand(input, &vars), want, "{input:?}");
    }
}

#[test]
fn flags_are_found_in_every_go_form() {
    let mut args: Vec<String> = [
        "-csi-address=/a",
        "--csi-address",
        "/b",
        "--http-endpoint=:1",
        "-v=2",
    ]
    .map(String::from)
    .to_vec();
    assert_eq!(
        rewrite_flag(&mut args, "csi-address", |old| format!("{old}!")),
        2
    );
    assert_eq!(args[..3], ["-csi-address=/a!", "--csi-address", "/b!"]);
    assert_eq!(last_value(&args, "http-endpoint").as_deref(), Some(":1"));
    assert_eq!(last_value(&args, "csi-address").as_deref(), Some("/b!"));
    let bools = |a: &[&str]| {
        last_bool(
            &a.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            "leader-election",
        )
    };
    assert_eq!(bools(&["--leader-election"]), Some(true));
    assert_eq!(
        bools(&["-leader-election=true", "--leader-election=false"]),
        Some(false)
    );
    assert_eq!(bools(&["--leader-election-namespace=x"]), None);
}
