//! The workload: VolumeAttachments the way kube-controller-manager names them
//! (`csi-<sha256(handle + driver + node)>`) and custom names, RWO and RWX PVs,
//! some with a publish secret holding the canary, creates, deletes, and
//! same-name re-creates on another node.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

use crate::rng::Rng;
use crate::world::{lock, now_nanos, DRIVER};

pub const NODES: usize = 6;
pub const SECRET: &str = "chaos-publish-secret";

pub fn node_name(k: usize) -> String {
    format!("chaos-node-{k}")
}

#[derive(Debug, Clone)]
pub struct Instance {
    pub name: String,
    pub uid: String,
    pub pv: String,
    pub handle: String,
    pub node: String,
    /// When the suite asked for it.
    pub created: i128,
    pub deleted: Option<i128>,
}

#[derive(Debug, Clone)]
pub struct Pv {
    pub name: String,
    pub handle: String,
    pub rwx: bool,
    pub deleted: bool,
}

#[derive(Default)]
pub struct State {
    pub instances: Vec<Instance>,
    pub pvs: Vec<Pv>,
    pub pairs: HashSet<(String, String)>,
    pub errors: u64,
    pub creates: u64,
    pub deletes: u64,
    pub moves: u64,
}

pub struct Workload {
    pub state: Mutex<State>,
    pub stop: AtomicBool,
    next: AtomicU64,
    client: kube::Client,
}

fn kcm_name(handle: &str, node: &str) -> String {
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        format!("{handle}{DRIVER}{node}").as_bytes(),
    );
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("csi-{hex}")
}

impl Workload {
    pub fn new(client: kube::Client) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State::default()),
            stop: AtomicBool::new(false),
            next: AtomicU64::new(0),
            client,
        })
    }

    fn vas(&self) -> Api<VolumeAttachment> {
        Api::all(self.client.clone())
    }

    fn pvs(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }

    fn error(&self) {
        lock(&self.state).errors += 1;
    }

    pub async fn run(self: Arc<Self>, seed: u64) {
        let mut rng = Rng::new(seed ^ 0x0005_eed0_fa11);
        while !self.stop.load(Ordering::Relaxed) {
            let live = lock(&self.state)
                .instances
                .iter()
                .filter(|i| i.deleted.is_none())
                .count();
            let r = rng.f64();
            if live < 20 && r < 0.5 {
                self.create(&mut rng).await;
            } else if r < 0.85 && live > 0 {
                self.delete_random(&mut rng).await;
            } else if r < 0.95 {
                self.move_random(&mut rng);
            } else {
                self.delete_pv(&mut rng).await;
            }
            tokio::time::sleep(Duration::from_millis(120 + rng.below(100))).await;
        }
    }

    /// A node where `handle` was never attached, if any.
    fn free_node(&self, rng: &mut Rng, handle: &str) -> Option<String> {
        let state = lock(&self.state);
        let free: Vec<String> = (0..NODES)
            .map(node_name)
            .filter(|n| !state.pairs.contains(&(handle.to_string(), n.clone())))
            .collect();
        (!free.is_empty()).then(|| free[rng.below(free.len() as u64) as usize].clone())
    }

    async fn new_pv(&self, rng: &mut Rng) -> Option<Pv> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let name = format!("chaos-pv-{n}");
        let handle = format!("vol-{n}");
        let rwx = rng.f64() < 0.5;
        let mut pv = json!({
            "metadata": {"name": name},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": [if rwx { "ReadWriteMany" } else { "ReadWriteOnce" }],
                "persistentVolumeReclaimPolicy": "Retain",
                "csi": {"driver": DRIVER, "volumeHandle": handle},
            }
        });
        if rng.f64() < 0.3 {
            pv["spec"]["csi"]["controllerPublishSecretRef"] =
                json!({"namespace": "default", "name": SECRET});
        }
        let pv: PersistentVolume = serde_json::from_value(pv).ok()?;
        match tokio::time::timeout(
            Duration::from_secs(5),
            self.pvs().create(&PostParams::default(), &pv),
        )
        .await
        {
            Ok(Ok(_)) => {
                let pv = Pv {
                    name,
                    handle,
                    rwx,
                    deleted: false,
                };
                lock(&self.state).pvs.push(pv.clone());
                Some(pv)
            }
            _ => {
                self.error();
                None
            }
        }
    }

    async fn create(&self, rng: &mut Rng) {
        let existing = {
            let state = lock(&self.state);
            let rwx: Vec<Pv> = state
                .pvs
                .iter()
                .filter(|p| p.rwx && !p.deleted)
                .cloned()
                .collect();
            (!rwx.is_empty() && rng.f64() < 0.4)
                .then(|| rwx[rng.below(rwx.len() as u64) as usize].clone())
        };
        let pv = match existing {
            Some(pv) => pv,
            None => match self.new_pv(rng).await {
                Some(pv) => pv,
                None => return,
            },
        };
        let Some(node) = self.free_node(rng, &pv.handle) else {
            return;
        };
        let name = if rng.f64() < 0.6 {
            kcm_name(&pv.handle, &node)
        } else {
            format!("chaos-va-{}", self.next.fetch_add(1, Ordering::Relaxed))
        };
        self.create_va(&name, &pv, &node).await;
    }

    async fn create_va(&self, name: &str, pv: &Pv, node: &str) -> bool {
        lock(&self.state)
            .pairs
            .insert((pv.handle.clone(), node.to_string()));
        let va: VolumeAttachment = match serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"attacher": DRIVER, "nodeName": node, "source": {"persistentVolumeName": pv.name}},
        })) {
            Ok(va) => va,
            Err(_) => return false,
        };
        let created = now_nanos();
        match tokio::time::timeout(
            Duration::from_secs(5),
            self.vas().create(&PostParams::default(), &va),
        )
        .await
        {
            Ok(Ok(va)) => {
                let mut state = lock(&self.state);
                state.creates += 1;
                state.instances.push(Instance {
                    name: name.to_string(),
                    uid: va.metadata.uid.unwrap_or_default(),
                    pv: pv.name.clone(),
                    handle: pv.handle.clone(),
                    node: node.to_string(),
                    created,
                    deleted: None,
                });
                true
            }
            _ => {
                // Timed out or failed: it may exist anyway (lost reply); look.
                if let Ok(Ok(Some(va))) =
                    tokio::time::timeout(Duration::from_secs(5), self.vas().get_opt(name)).await
                {
                    if va.spec.node_name == node {
                        let mut state = lock(&self.state);
                        state.instances.push(Instance {
                            name: name.to_string(),
                            uid: va.metadata.uid.unwrap_or_default(),
                            pv: pv.name.clone(),
                            handle: pv.handle.clone(),
                            node: node.to_string(),
                            created,
                            deleted: None,
                        });
                        return true;
                    }
                }
                self.error();
                false
            }
        }
    }

    async fn delete_instance(&self, index: usize) -> bool {
        let (name, uid) = {
            let state = lock(&self.state);
            (
                state.instances[index].name.clone(),
                state.instances[index].uid.clone(),
            )
        };
        let params = DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let at = now_nanos();
        match tokio::time::timeout(Duration::from_secs(5), self.vas().delete(&name, &params)).await
        {
            Ok(result)
                if result.as_ref().is_ok()
                    || matches!(result, Err(kube::Error::Api(ref s)) if s.code == 404) =>
            {
                let mut state = lock(&self.state);
                state.instances[index].deleted = Some(at);
                state.deletes += 1;
                true
            }
            _ => {
                self.error();
                false
            }
        }
    }

    fn live_indices(&self, custom_only: bool) -> Vec<usize> {
        lock(&self.state)
            .instances
            .iter()
            .enumerate()
            .filter(|(_, i)| {
                i.deleted.is_none() && (!custom_only || i.name.starts_with("chaos-va-"))
            })
            .map(|(n, _)| n)
            .collect()
    }

    async fn delete_random(&self, rng: &mut Rng) {
        let live = self.live_indices(false);
        if !live.is_empty() {
            self.delete_instance(live[rng.below(live.len() as u64) as usize])
                .await;
        }
    }

    /// Deletes a custom-named VA and, once it is gone, creates the same name on another node.
    fn move_random(self: &Arc<Self>, rng: &mut Rng) {
        let live = self.live_indices(true);
        if live.is_empty() {
            return;
        }
        let index = live[rng.below(live.len() as u64) as usize];
        let this = Arc::clone(self);
        let mut rng = Rng::new(rng.next());
        tokio::spawn(async move {
            if !this.delete_instance(index).await {
                return;
            }
            let (name, pv_name) = {
                let state = lock(&this.state);
                (
                    state.instances[index].name.clone(),
                    state.instances[index].pv.clone(),
                )
            };
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            loop {
                if this.stop.load(Ordering::Relaxed) || tokio::time::Instant::now() > deadline {
                    return;
                }
                if let Ok(Ok(None)) =
                    tokio::time::timeout(Duration::from_secs(3), this.vas().get_opt(&name)).await
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let pv = lock(&this.state)
                .pvs
                .iter()
                .find(|p| p.name == pv_name)
                .cloned();
            let Some(pv) = pv.filter(|p| !p.deleted) else {
                return;
            };
            if let Some(node) = this.free_node(&mut rng, &pv.handle) {
                if this.create_va(&name, &pv, &node).await {
                    lock(&this.state).moves += 1;
                }
            }
        });
    }

    /// Deletes a PV no live VA uses.
    async fn delete_pv(&self, rng: &mut Rng) {
        let candidates: Vec<String> = {
            let state = lock(&self.state);
            state
                .pvs
                .iter()
                .filter(|p| {
                    !p.deleted
                        && !state
                            .instances
                            .iter()
                            .any(|i| i.pv == p.name && i.deleted.is_none())
                })
                .map(|p| p.name.clone())
                .collect()
        };
        if candidates.is_empty() {
            return;
        }
        let name = candidates[rng.below(candidates.len() as u64) as usize].clone();
        if let Ok(Ok(_)) = tokio::time::timeout(
            Duration::from_secs(5),
            self.pvs().delete(&name, &DeleteParams::default()),
        )
        .await
        {
            let mut state = lock(&self.state);
            if let Some(pv) = state.pvs.iter_mut().find(|p| p.name == name) {
                pv.deleted = true;
            }
        } else {
            self.error();
        }
    }

    /// Creates a fresh VA on a fresh PV; its instance.
    pub async fn fresh_va(&self, rng: &mut Rng) -> Option<Instance> {
        let name = self.probe_va(rng).await?;
        lock(&self.state)
            .instances
            .iter()
            .rfind(|i| i.name == name)
            .cloned()
    }

    /// Records that VA `name` (`uid`) was deleted at `at` by someone else
    /// (a fault), so that the workload does not delete it again.
    pub fn deleted_by_fault(&self, name: &str, uid: &str, at: i128) {
        let mut state = lock(&self.state);
        if let Some(inst) = state
            .instances
            .iter_mut()
            .find(|i| i.name == name && i.uid == uid && i.deleted.is_none())
        {
            inst.deleted = Some(at);
            state.deletes += 1;
        }
    }

    /// Creates a fresh VA on a fresh PV and returns (instance name, node).
    pub async fn probe_va(&self, rng: &mut Rng) -> Option<String> {
        let pv = self.new_pv(rng).await?;
        let node = self.free_node(rng, &pv.handle)?;
        let name = kcm_name(&pv.handle, &node);
        self.create_va(&name, &pv, &node).await.then_some(name)
    }
}
