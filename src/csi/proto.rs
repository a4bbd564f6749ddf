//! Generated CSI v1 types and gRPC stubs (from `proto/csi.proto`), plus the
//! redacting `Debug` impls for requests that carry secrets.

#![allow(missing_docs, clippy::all, clippy::pedantic)]

tonic::include_proto!("csi.v1");

use std::collections::HashMap;
use std::fmt;

/// Shows which secret keys are present, never their values.
struct Redacted<'a>(&'a HashMap<String, String>);

impl fmt::Debug for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut keys: Vec<&str> = self.0.keys().map(String::as_str).collect();
        keys.sort_unstable();
        f.debug_map()
            .entries(keys.into_iter().map(|k| (k, "***stripped***")))
            .finish()
    }
}

impl fmt::Debug for ControllerPublishVolumeRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControllerPublishVolumeRequest")
            .field("volume_id", &self.volume_id)
            .field("node_id", &self.node_id)
            .field("volume_capability", &self.volume_capability)
            .field("readonly", &self.readonly)
            .field("secrets", &Redacted(&self.secrets))
            .field("volume_context", &self.volume_context)
            .finish()
    }
}

impl fmt::Debug for ControllerUnpublishVolumeRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControllerUnpublishVolumeRequest")
            .field("volume_id", &self.volume_id)
            .field("node_id", &self.node_id)
            .field("secrets", &Redacted(&self.secrets))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_of_requests_never_shows_secret_values() {
        let secrets: HashMap<String, String> =
            [("password".to_string(), "hunter2".to_string())].into();
        let publish = ControllerPublishVolumeRequest {
            volume_id: "vol-1".into(),
            secrets: secrets.clone(),
            ..Default::default()
        };
        let unpublish = ControllerUnpublishVolumeRequest {
            volume_id: "vol-1".into(),
            secrets,
            ..Default::default()
        };
        for text in [
            format!("{publish:?}"),
            format!("{unpublish:?}"),
            format!("{publish:#?}"),
        ] {
            assert!(!text.contains("hunter2"), "secret leaked: {text}");
            assert!(text.contains("password"), "key should be visible: {text}");
            assert!(text.contains("vol-1"));
        }
    }
}
