//! The release kit: `--version` names the build, and the Dockerfile,
//! .dockerignore and CHANGELOG.md agree with the crate.

use std::path::Path;
use std::process::Command;

fn repo_file(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// `git rev-parse HEAD` of this checkout, None outside one.
fn head_commit() -> Option<String> {
    let out = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[test]
fn version_prints_the_version_commit_build_date_and_compiler() {
    let binary = env!("CARGO_BIN_EXE_csi-attacher");
    let out = Command::new(binary)
        .arg("--version")
        .output()
        .expect("run --version");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).expect("UTF-8");
    // build.rs re-runs when HEAD moves, so the binary under test names HEAD
    // (or `unknown` outside a checkout, unless CSI_ATTACHER_GIT_COMMIT said otherwise).
    let commit = std::env::var("CSI_ATTACHER_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(head_commit)
        .unwrap_or_else(|| "unknown".to_string());
    let pattern = format!(
        r"^{} {} \(commit {commit}, built \d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\dZ, rustc \d+\.\d+\.\d+[^)]*\)\)?\n$",
        regex::escape(binary),
        regex::escape(env!("CARGO_PKG_VERSION")),
    );
    assert!(
        regex::Regex::new(&pattern).expect("regex").is_match(&text),
        "{text:?} does not match {pattern}"
    );
    // Upstream's first two words: `<argv0> <version>`.
    let mut words = text.split_whitespace();
    assert_eq!(words.next(), Some(binary));
    assert_eq!(words.next(), Some(env!("CARGO_PKG_VERSION")));
}

#[test]
fn the_image_labels_the_crate_version_and_license() {
    let dockerfile = repo_file("Dockerfile");
    assert!(
        dockerfile.contains(&format!("ARG VERSION={}\n", env!("CARGO_PKG_VERSION"))),
        "Dockerfile's ARG VERSION is not Cargo.toml's {}",
        env!("CARGO_PKG_VERSION")
    );
    let manifest = repo_file("Cargo.toml");
    let license = manifest
        .lines()
        .find_map(|l| l.strip_prefix("license = "))
        .expect("license in Cargo.toml")
        .trim_matches('"');
    assert!(
        dockerfile.contains(&format!("org.opencontainers.image.licenses=\"{license}\"")),
        "image license label is not {license}"
    );
    assert!(repo_file("LICENSE").contains("Apache License\n                           Version 2.0"));
    // Both platforms of the issue are mapped to a Rust target.
    for arch in ["amd64)", "arm64)"] {
        assert!(
            dockerfile.contains(arch),
            "no {arch} case in the Dockerfile"
        );
    }
}

#[test]
fn the_changelog_has_this_version() {
    let changelog = repo_file("CHANGELOG.md");
    assert!(
        changelog.contains(&format!("\n## [{}] - ", env!("CARGO_PKG_VERSION"))),
        "CHANGELOG.md has no section for {}",
        env!("CARGO_PKG_VERSION")
    );
    assert!(changelog.contains("\n## [Unreleased]\n"));
}

/// The image build context is the allow-list of .dockerignore: it must hold
/// what `cargo build` reads and what the Dockerfile copies, and no target/.
#[test]
fn the_docker_build_context_has_what_the_build_needs_and_no_target_dir() {
    let ignore = repo_file(".dockerignore");
    let rules: Vec<&str> = ignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(rules.first(), Some(&"*"), "an allow-list: `*` first");
    let allowed: Vec<&str> = rules[1..]
        .iter()
        .map(|r| {
            r.strip_prefix('!')
                .unwrap_or_else(|| panic!("only `!path` after `*`: {r}"))
                .trim_end_matches('/')
        })
        .collect();
    let in_context = |path: &str| {
        allowed
            .iter()
            .any(|a| path == *a || path.starts_with(&format!("{a}/")))
    };
    let mut needed = vec![
        "Cargo.toml",
        "Cargo.lock",
        "build.rs",
        "proto/csi.proto",
        "proto/k8s_views.proto",
        "src/main.rs",
        "src/lib.rs",
        "LICENSE",
    ];
    // Cargo.toml's explicit targets must exist for the manifest to load.
    let manifest = repo_file("Cargo.toml");
    let benches: Vec<String> = manifest
        .split("[[bench]]")
        .skip(1)
        .filter_map(|section| {
            // The target's own keys: up to the next table.
            let keys: Vec<&str> = section
                .lines()
                .take_while(|l| !l.starts_with('['))
                .collect();
            let key = |k: &str| {
                keys.iter()
                    .find_map(|l| l.strip_prefix(k)?.strip_prefix(" = "))
                    .map(|v| v.trim_matches('"'))
            };
            match key("path") {
                Some(path) => Some(path.to_owned()),
                None => Some(format!("benches/{}.rs", key("name")?)),
            }
        })
        .collect();
    needed.extend(benches.iter().map(String::as_str));
    // The workspace's other member must load too.
    needed.extend([
        "tools/csi-mock-driver/Cargo.toml",
        "tools/csi-mock-driver/src/main.rs",
    ]);
    for path in needed {
        assert!(in_context(path), "{path} is not in the build context");
        assert!(
            Path::new(env!("CARGO_MANIFEST_DIR")).join(path).exists(),
            "{path} does not exist"
        );
    }
    for path in [
        "target/debug",
        ".git/HEAD",
        "tests/attach.rs",
        "bench/results.json",
    ] {
        assert!(!in_context(path), "{path} is sent to the image build");
    }
}
