//! The pinned Go tools that are not part of the control plane (promtool, the
//! GCE PD driver, goprops): each from its environment variable (set by
//! hack/test.sh or hack/properties.sh), else built (or found in the cache) by
//! hack/build-gotool.sh.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The binary `env_var` names, else the one `build` (a `hack/build-gotool.sh
/// <module dir> <binary> <package>` command line, run from the repository)
/// prints on its last line. The error says what is missing; each caller's
/// panic says how to get it.
pub fn find(env_var: &str, build: &str) -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(env_var).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("{env_var}={} does not exist", path.display()))
        };
    }
    let mut args = build.split(' ');
    let script = super::repo_root().join(args.next().unwrap_or_default());
    let output = Command::new("bash")
        .arg(&script)
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    match stdout.lines().last().map(str::trim) {
        Some(path) if output.status.success() && Path::new(path).is_file() => {
            Ok(PathBuf::from(path))
        }
        _ => Err(format!("{} failed ({})", script.display(), output.status)),
    }
}
