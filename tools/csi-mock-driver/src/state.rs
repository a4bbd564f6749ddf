//! The published table and CSI publish semantics (CSI spec, ControllerPublishVolume).

use std::collections::{BTreeMap, HashMap};

use csi_attacher::csi::proto::{volume_capability::access_mode::Mode, VolumeCapability};
use tonic::{Code, Status};

/// One volume published on one node.
#[derive(Debug, Clone, PartialEq)]
pub struct Publication {
    /// `None` when the entry was written through the admin API.
    pub capability: Option<VolumeCapability>,
    pub readonly: bool,
    pub context: HashMap<String, String>,
}

/// One ListVolumes page: (volume ID, node IDs) entries and the next token.
pub type Page = (Vec<(String, Vec<String>)>, String);

/// volume ID → node ID → publication.
#[derive(Debug, Default)]
pub struct Published {
    volumes: BTreeMap<String, BTreeMap<String, Publication>>,
    /// 0 = unlimited; else RESOURCE_EXHAUSTED past this many volumes on one node.
    pub max_volumes_per_node: usize,
    /// Set by [`Self::freeze`]: the table was saved for the next process and
    /// changes no more (a call still running is refused with UNAVAILABLE).
    frozen: bool,
}

impl Published {
    /// An empty table with a per-node volume limit (0 = unlimited).
    pub fn with_limit(max_volumes_per_node: usize) -> Self {
        Self {
            max_volumes_per_node,
            ..Self::default()
        }
    }

    /// Publishes `volume` on `node`, idempotently.
    pub fn publish(
        &mut self,
        volume: &str,
        node: &str,
        capability: &VolumeCapability,
        readonly: bool,
    ) -> Result<HashMap<String, String>, Status> {
        self.writable()?;
        if let Some(context) = self.check(volume, node, capability, readonly)? {
            return Ok(context);
        }
        Ok(self.insert(volume, node, capability, readonly))
    }

    /// Whether `volume` may be published on `node` (CSI semantics, the
    /// per-node limit): `Some(context)` when it already is, compatibly;
    /// `None` when it may be; the CSI error when it may not.
    pub fn check(
        &self,
        volume: &str,
        node: &str,
        capability: &VolumeCapability,
        readonly: bool,
    ) -> Result<Option<HashMap<String, String>>, Status> {
        if let Some(existing) = self.volumes.get(volume).and_then(|nodes| nodes.get(node)) {
            let compatible = existing.readonly == readonly
                && existing.capability.as_ref().is_none_or(|c| c == capability);
            return if compatible {
                Ok(Some(existing.context.clone()))
            } else {
                Err(Status::new(
                    Code::AlreadyExists,
                    format!("volume {volume} is already published on node {node} with an incompatible capability or readonly flag"),
                ))
            };
        }
        let mode = capability
            .access_mode
            .map(|m| m.mode())
            .unwrap_or(Mode::Unknown);
        let single_node = matches!(
            mode,
            Mode::SingleNodeWriter
                | Mode::SingleNodeReaderOnly
                | Mode::SingleNodeSingleWriter
                | Mode::SingleNodeMultiWriter
        );
        if single_node {
            if let Some(other) = self.volumes.get(volume).and_then(|n| n.keys().next()) {
                return Err(Status::new(
                    Code::FailedPrecondition,
                    format!("volume {volume} is single-node and already published on node {other}"),
                ));
            }
        }
        if self.max_volumes_per_node > 0 {
            let on_node = self.on_node(node);
            if on_node >= self.max_volumes_per_node {
                return Err(Status::new(
                    Code::ResourceExhausted,
                    format!("node {node} already has {on_node} volumes published"),
                ));
            }
        }
        Ok(None)
    }

    /// Records `volume` as published on `node` (after [`Self::check`]); its context.
    /// A frozen table stays as it is (the process is stopping).
    pub fn insert(
        &mut self,
        volume: &str,
        node: &str,
        capability: &VolumeCapability,
        readonly: bool,
    ) -> HashMap<String, String> {
        let context: HashMap<String, String> =
            [("devicePath".to_string(), format!("/dev/mock/{volume}"))].into();
        if self.frozen {
            return context;
        }
        self.volumes.entry(volume.to_string()).or_default().insert(
            node.to_string(),
            Publication {
                capability: Some(capability.clone()),
                readonly,
                context: context.clone(),
            },
        );
        context
    }

    /// How many volumes are published on `node`.
    pub fn on_node(&self, node: &str) -> usize {
        self.volumes
            .values()
            .filter(|n| n.contains_key(node))
            .count()
    }

    /// The publish context of `volume` on `node`, if it is published there.
    pub fn context(&self, volume: &str, node: &str) -> Option<HashMap<String, String>> {
        self.volumes
            .get(volume)
            .and_then(|nodes| nodes.get(node))
            .map(|p| p.context.clone())
    }

    /// Whether `volume` is published on `node`.
    pub fn contains(&self, volume: &str, node: &str) -> bool {
        self.volumes
            .get(volume)
            .is_some_and(|nodes| nodes.contains_key(node))
    }

    /// Forgets every publication on `node` (the cloud deleted the instance).
    pub fn remove_node(&mut self, node: &str) {
        if self.frozen {
            return;
        }
        self.volumes.retain(|_, nodes| {
            nodes.remove(node);
            !nodes.is_empty()
        });
    }

    /// Unpublishes `volume` from `node` (all nodes when `node` is empty). Unknown → OK.
    pub fn unpublish(&mut self, volume: &str, node: &str) -> Result<(), Status> {
        self.writable()?;
        if let Some(nodes) = self.volumes.get_mut(volume) {
            if node.is_empty() {
                nodes.clear();
            } else {
                nodes.remove(node);
            }
            if nodes.is_empty() {
                self.volumes.remove(volume);
            }
        }
        Ok(())
    }

    /// The table for the state file; from now on nothing changes it, so a
    /// call that ends after the save cannot answer OK for a change the next
    /// process will not have.
    pub fn freeze(&mut self) -> BTreeMap<String, Vec<String>> {
        self.frozen = true;
        self.table()
    }

    /// UNAVAILABLE once the table is frozen.
    pub fn writable(&self) -> Result<(), Status> {
        if self.frozen {
            return Err(Status::unavailable(
                "the driver is stopping: its state is saved and changes no more",
            ));
        }
        Ok(())
    }

    /// One ListVolumes page: `(entries, next_token)`; the token is an index.
    pub fn page(&self, max_entries: i32, starting_token: &str) -> Result<Page, Status> {
        if max_entries < 0 {
            return Err(Status::invalid_argument("max_entries must not be negative"));
        }
        let start = if starting_token.is_empty() {
            0
        } else {
            match starting_token.parse::<usize>() {
                Ok(n) if n <= self.volumes.len() => n,
                _ => {
                    return Err(Status::aborted(format!(
                        "invalid starting_token {starting_token:?}"
                    )))
                }
            }
        };
        let take = if max_entries == 0 {
            usize::MAX
        } else {
            max_entries as usize
        };
        let entries: Vec<(String, Vec<String>)> = self
            .volumes
            .iter()
            .skip(start)
            .take(take)
            .map(|(v, nodes)| (v.clone(), nodes.keys().cloned().collect()))
            .collect();
        let end = start + entries.len();
        let next = if end < self.volumes.len() {
            end.to_string()
        } else {
            String::new()
        };
        Ok((entries, next))
    }

    /// volume → nodes, for the admin API.
    pub fn table(&self) -> BTreeMap<String, Vec<String>> {
        self.volumes
            .iter()
            .map(|(v, nodes)| (v.clone(), nodes.keys().cloned().collect()))
            .collect()
    }

    /// Replaces the table (simulates changes behind the attacher's back).
    pub fn replace(&mut self, table: BTreeMap<String, Vec<String>>) {
        self.volumes = table
            .into_iter()
            .filter(|(_, nodes)| !nodes.is_empty())
            .map(|(volume, nodes)| {
                let context: HashMap<String, String> =
                    [("devicePath".to_string(), format!("/dev/mock/{volume}"))].into();
                let nodes = nodes
                    .into_iter()
                    .map(|n| {
                        (
                            n,
                            Publication {
                                capability: None,
                                readonly: false,
                                context: context.clone(),
                            },
                        )
                    })
                    .collect();
                (volume, nodes)
            })
            .collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_attacher::csi::proto::volume_capability::{AccessMode, AccessType, MountVolume};

    fn cap(mode: Mode) -> VolumeCapability {
        VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume::default())),
            access_mode: Some(AccessMode { mode: mode as i32 }),
        }
    }

    #[test]
    fn republish_is_idempotent_and_incompatible_republish_is_already_exists() {
        let mut p = Published::default();
        let first = p
            .publish("v", "n1", &cap(Mode::SingleNodeWriter), false)
            .expect("publish");
        let again = p
            .publish("v", "n1", &cap(Mode::SingleNodeWriter), false)
            .expect("again");
        assert_eq!(first, again);
        let err = p
            .publish("v", "n1", &cap(Mode::SingleNodeWriter), true)
            .expect_err("ro differs");
        assert_eq!(err.code(), Code::AlreadyExists);
    }

    #[test]
    fn single_node_volume_elsewhere_is_failed_precondition_multi_node_is_fine() {
        let mut p = Published::default();
        p.publish("v", "n1", &cap(Mode::SingleNodeWriter), false)
            .expect("publish");
        let err = p
            .publish("v", "n2", &cap(Mode::SingleNodeWriter), false)
            .expect_err("n2");
        assert_eq!(err.code(), Code::FailedPrecondition);
        p.publish("m", "n1", &cap(Mode::MultiNodeMultiWriter), false)
            .expect("m n1");
        p.publish("m", "n2", &cap(Mode::MultiNodeMultiWriter), false)
            .expect("m n2");
    }

    #[test]
    fn node_limit_is_resource_exhausted() {
        let mut p = Published::with_limit(1);
        p.publish("a", "n1", &cap(Mode::SingleNodeWriter), false)
            .expect("a");
        let err = p
            .publish("b", "n1", &cap(Mode::SingleNodeWriter), false)
            .expect_err("b");
        assert_eq!(err.code(), Code::ResourceExhausted);
    }

    #[test]
    fn pages_follow_tokens_and_reject_bad_ones() {
        let mut p = Published::default();
        for v in ["a", "b", "c"] {
            p.publish(v, "n", &cap(Mode::MultiNodeMultiWriter), false)
                .expect("publish");
        }
        let (first, next) = p.page(2, "").expect("page 1");
        assert_eq!(first.len(), 2);
        let (second, last) = p.page(2, &next).expect("page 2");
        assert_eq!(second, vec![("c".to_string(), vec!["n".to_string()])]);
        assert_eq!(last, "");
        assert_eq!(p.page(2, "x").expect_err("bad").code(), Code::Aborted);
        assert_eq!(p.page(2, "9").expect_err("past end").code(), Code::Aborted);
    }

    #[test]
    fn unpublish_of_unknown_is_ok_and_empty_node_means_all() {
        let mut p = Published::default();
        p.unpublish("nothing", "n1").expect("unknown is OK");
        p.publish("m", "n1", &cap(Mode::MultiNodeMultiWriter), false)
            .expect("n1");
        p.publish("m", "n2", &cap(Mode::MultiNodeMultiWriter), false)
            .expect("n2");
        p.unpublish("m", "").expect("all nodes");
        assert!(p.table().is_empty());
    }
}
