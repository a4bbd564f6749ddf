//! Names other components read: finalizer, annotations, sanitised driver name.
//! Contract: `docs/contract.md#finalizers-and-annotations`.

/// Annotation on a VA: the node ID the volume was published to (read by
/// [`crate::controller::flows::node_id`]).
pub const NODE_ID_ANNOTATION: &str = "csi.alpha.kubernetes.io/node-id";

/// Annotation on an in-tree PV: the CSI driver it was migrated to.
pub const MIGRATED_TO_ANNOTATION: &str = "pv.kubernetes.io/migrated-to";

/// Upstream's `SanitizeDriverName`: every char outside `[a-zA-Z0-9-]` becomes
/// `-`, and a trailing `-` gets an `X` appended. No lower-casing, no length limit.
pub fn sanitize_driver_name(driver_name: &str) -> String {
    let mut out = driver_name.replace(|c: char| !c.is_ascii_alphanumeric() && c != '-', "-");
    if out.ends_with('-') {
        out.push('X');
    }
    out
}

/// The finalizer on VAs and PVs: `external-attacher/<sanitised driver>`.
pub fn finalizer(driver_name: &str) -> String {
    format!("external-attacher/{}", sanitize_driver_name(driver_name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitising_matches_upstream_examples() {
        assert_eq!(
            sanitize_driver_name("not!allowed/characters"),
            "not-allowed-characters"
        );
        assert_eq!(sanitize_driver_name("trailing\\"), "trailing-X");
        assert_eq!(
            sanitize_driver_name("s!a@n#i$t(i%z^e&d*"),
            "s-a-n-i-t-i-z-e-d-X"
        );
        assert_eq!(
            sanitize_driver_name("hostpath.csi.k8s.io"),
            "hostpath-csi-k8s-io"
        );
    }

    #[test]
    fn finalizer_uses_the_sanitised_name() {
        assert_eq!(finalizer("csi/test"), "external-attacher/csi-test");
        assert_eq!(
            finalizer("pd.csi.storage.gke.io"),
            "external-attacher/pd-csi-storage-gke-io"
        );
    }
}
