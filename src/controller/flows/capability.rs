//! VolumeCapability from a PV (or inline) spec (as upstream external-attacher v4.12).
//!
//! Pure: values in, a capability or upstream's error text out.

use crate::csi::proto::volume_capability::{
    access_mode::Mode, AccessMode, AccessType, BlockVolume, MountVolume,
};
use crate::csi::proto::VolumeCapability;
use crate::csi::Capabilities;

/// Why no capability can be built; texts are upstream's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CapabilityError {
    /// ReadWriteOncePod together with another mode.
    #[error("Kubernetes does not support use of ReadWriteOncePod with other access modes on the same PersistentVolume")]
    RwopWithOthers,
    /// ReadOnlyMany together with ReadWriteOnce.
    #[error("CSI does not support ReadOnlyMany and ReadWriteOnce on the same PersistentVolume")]
    RoxWithRwo,
    /// No or unknown modes.
    #[error("unsupported AccessMode combination: [{}]", .0.join(" "))]
    Unsupported(Vec<String>),
}

/// The parts of a PV spec the capability depends on.
#[derive(Debug, Clone, Copy)]
pub struct CapabilitySource<'a> {
    /// `spec.accessModes`.
    pub access_modes: &'a [String],
    /// `spec.volumeMode == Block`.
    pub block: bool,
    /// `spec.mountOptions`.
    pub mount_options: &'a [String],
    /// `spec.csi.fsType`.
    pub fs_type: Option<&'a str>,
}

/// Builds the capability; `default_fs_type` fills an empty fsType (`--default-fstype`).
pub fn volume_capability(
    source: CapabilitySource<'_>,
    default_fs_type: &str,
    capabilities: &Capabilities,
) -> Result<VolumeCapability, CapabilityError> {
    let mode = access_mode(source.access_modes, capabilities)?;
    let access_type = if source.block {
        AccessType::Block(BlockVolume {})
    } else {
        let fs_type = match source.fs_type {
            Some(fs) if !fs.is_empty() => fs.to_string(),
            _ => default_fs_type.to_string(),
        };
        AccessType::Mount(MountVolume {
            fs_type,
            mount_flags: source.mount_options.to_vec(),
            volume_mount_group: String::new(),
        })
    };
    Ok(VolumeCapability {
        access_type: Some(access_type),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    })
}

/// Kubernetes access modes (a set) → one CSI access mode. A single-node
/// volume gets the classic `SINGLE_NODE_WRITER`, or the finer
/// `SINGLE_NODE_SINGLE_WRITER` (ReadWriteOncePod) / `SINGLE_NODE_MULTI_WRITER`
/// (ReadWriteOnce) when the driver has the `SINGLE_NODE_MULTI_WRITER`
/// controller capability.
pub fn access_mode(modes: &[String], capabilities: &Capabilities) -> Result<Mode, CapabilityError> {
    let multi_writer = capabilities.single_node_multi_writer;
    let has = |m: &str| modes.iter().any(|x| x == m);
    let (rwo, rox, rwx, rwop) = (
        has("ReadWriteOnce"),
        has("ReadOnlyMany"),
        has("ReadWriteMany"),
        has("ReadWriteOncePod"),
    );
    if rwop {
        if rwo || rox || rwx {
            return Err(CapabilityError::RwopWithOthers);
        }
        return Ok(if multi_writer {
            Mode::SingleNodeSingleWriter
        } else {
            Mode::SingleNodeWriter
        });
    }
    if rwx {
        return Ok(Mode::MultiNodeMultiWriter);
    }
    if rox && rwo {
        return Err(CapabilityError::RoxWithRwo);
    }
    if rox {
        return Ok(Mode::MultiNodeReaderOnly);
    }
    if rwo {
        return Ok(if multi_writer {
            Mode::SingleNodeMultiWriter
        } else {
            Mode::SingleNodeWriter
        });
    }
    Err(CapabilityError::Unsupported(modes.to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn modes(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    /// A driver without SINGLE_NODE_MULTI_WRITER.
    const CLASSIC: &Capabilities = &Capabilities {
        controller_service: true,
        publish_unpublish: true,
        publish_readonly: false,
        list_volumes: false,
        list_volumes_published_nodes: false,
        single_node_multi_writer: false,
    };

    /// A driver with SINGLE_NODE_MULTI_WRITER.
    const MULTI_WRITER: &Capabilities = &Capabilities {
        single_node_multi_writer: true,
        ..*CLASSIC
    };

    #[test]
    fn access_mode_table_matches_upstream() {
        use Mode::*;
        type Case<'a> = (
            &'a [&'a str],
            Result<Mode, CapabilityError>,
            Result<Mode, CapabilityError>,
        );
        let cases: &[Case<'_>] = &[
            (
                &["ReadWriteOncePod"],
                Ok(SingleNodeWriter),
                Ok(SingleNodeSingleWriter),
            ),
            (
                &["ReadWriteOncePod", "ReadWriteOncePod"],
                Ok(SingleNodeWriter),
                Ok(SingleNodeSingleWriter),
            ),
            (
                &["ReadWriteOncePod", "ReadWriteOnce"],
                Err(CapabilityError::RwopWithOthers),
                Err(CapabilityError::RwopWithOthers),
            ),
            (
                &["ReadWriteOncePod", "ReadWriteMany"],
                Err(CapabilityError::RwopWithOthers),
                Err(CapabilityError::RwopWithOthers),
            ),
            (
                &["ReadWriteMany"],
                Ok(MultiNodeMultiWriter),
                Ok(MultiNodeMultiWriter),
            ),
            (
                &["ReadWriteMany", "ReadOnlyMany", "ReadWriteOnce"],
                Ok(MultiNodeMultiWriter),
                Ok(MultiNodeMultiWriter),
            ),
            (
                &["ReadOnlyMany", "ReadWriteOnce"],
                Err(CapabilityError::RoxWithRwo),
                Err(CapabilityError::RoxWithRwo),
            ),
            (
                &["ReadOnlyMany"],
                Ok(MultiNodeReaderOnly),
                Ok(MultiNodeReaderOnly),
            ),
            (
                &["ReadWriteOnce"],
                Ok(SingleNodeWriter),
                Ok(SingleNodeMultiWriter),
            ),
            (
                &["ReadWriteOnce", "ReadWriteOnce"],
                Ok(SingleNodeWriter),
                Ok(SingleNodeMultiWriter),
            ),
        ];
        for (input, default, multi) in cases {
            assert_eq!(
                &access_mode(&modes(input), CLASSIC),
                default,
                "{input:?} default"
            );
            assert_eq!(
                &access_mode(&modes(input), MULTI_WRITER),
                multi,
                "{input:?} SINGLE_NODE_MULTI_WRITER"
            );
        }
    }

    #[test]
    fn empty_or_unknown_modes_are_unsupported_with_upstream_text() {
        assert_eq!(
            access_mode(&[], CLASSIC).map_err(|e| e.to_string()),
            Err("unsupported AccessMode combination: []".to_string())
        );
        assert_eq!(
            access_mode(&modes(&["Bogus"]), CLASSIC).map_err(|e| e.to_string()),
            Err("unsupported AccessMode combination: [Bogus]".to_string())
        );
    }

    #[test]
    fn mount_uses_fs_type_then_default_and_keeps_mount_options() {
        let rwo = modes(&["ReadWriteOnce"]);
        let opts = modes(&["noatime"]);
        let source = CapabilitySource {
            access_modes: &rwo,
            block: false,
            mount_options: &opts,
            fs_type: Some(""),
        };
        let cap = volume_capability(source, "ext4", CLASSIC).expect("capability");
        assert_eq!(
            cap.access_type,
            Some(AccessType::Mount(MountVolume {
                fs_type: "ext4".into(),
                mount_flags: opts.clone(),
                volume_mount_group: String::new(),
            }))
        );
        let xfs = volume_capability(
            CapabilitySource {
                fs_type: Some("xfs"),
                ..source
            },
            "ext4",
            CLASSIC,
        )
        .expect("capability");
        assert!(matches!(xfs.access_type, Some(AccessType::Mount(ref m)) if m.fs_type == "xfs"));
    }

    #[test]
    fn block_has_no_fs_type_or_flags() {
        let rwx = modes(&["ReadWriteMany"]);
        let opts = modes(&["noatime"]);
        let cap = volume_capability(
            CapabilitySource {
                access_modes: &rwx,
                block: true,
                mount_options: &opts,
                fs_type: Some("ext4"),
            },
            "ext4",
            CLASSIC,
        )
        .expect("capability");
        assert_eq!(cap.access_type, Some(AccessType::Block(BlockVolume {})));
        assert_eq!(
            cap.access_mode,
            Some(AccessMode {
                mode: Mode::MultiNodeMultiWriter as i32
            })
        );
    }
}
