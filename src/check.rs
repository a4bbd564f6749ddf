//! `csi-attacher check`: a read-only report for operators, with the sidecar's
//! own flags (what it lists: `docs/operations.md#csi-attacher-check`). It never
//! writes: GET/LIST and SelfSubjectAccessReviews on the API; Probe, identity,
//! capabilities and ListVolumes on the driver.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::CSINode;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use serde::Serialize;

use crate::config::Config;
use crate::controller::error::ApiError;
use crate::controller::events;
use crate::controller::model::names::finalizer;
use crate::controller::model::store::{store_from, PvRefs, Stores};
use crate::controller::model::{CachedPv, CachedVa, Wire};
use crate::controller::reconcile;
use crate::controller::reconcile::orphans::{self, PROBE_NODE};
use crate::csi::metrics::CsiCallMetrics;
use crate::csi::{self, Client, DIAL_TIMEOUT};
use crate::kube_client;

/// Why the report could not be made.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("CSI driver: {0}")]
    Driver(#[from] csi::Error),
    #[error(transparent)]
    List(#[from] reconcile::ReconcileError),
    #[error(transparent)]
    Kube(#[from] kube_client::Error),
    #[error("listing {0}: {1}")]
    Api(&'static str, #[source] kube::Error),
}

/// The report (`docs/operations.md#csi-attacher-check`).
#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub driver: String,
    /// VAs of this driver.
    pub volume_attachments: usize,
    /// Else no mismatch or orphan is looked for.
    pub driver_lists_published_nodes: bool,
    pub mismatches: Vec<Mismatch>,
    /// Published to a node with no VolumeAttachment of this driver (an
    /// orphan, or a detach finishing as the report was made).
    pub orphans: Vec<Orphan>,
    pub errors: Vec<StuckError>,
    /// PVs and VAs being deleted that still hold our finalizer.
    pub deleting_pvs: Vec<String>,
    pub deleting_vas: Vec<String>,
    /// With `--unpublish-orphans`: whether orphans would be unpublished (RBAC
    /// may refuse the Node GETs it needs).
    pub orphan_cleanup: Option<&'static str>,
    /// Whether failure Events also go on claims and pods (RBAC decides).
    pub claim_events: String,
    /// Flags of these arguments that upstream v4.12 does not define (it exits
    /// 2 on them): to remove before going back. Not trouble: `is_clean` does
    /// not read it.
    pub not_in_upstream: Vec<String>,
}

/// One VA whose status (`attached`) and the driver (`published`) disagree.
#[derive(Debug, Serialize)]
pub struct Mismatch {
    pub volume_attachment: String,
    pub volume: String,
    pub node_id: String,
    pub attached: bool,
    pub published: bool,
}

/// A volume the driver lists as published to a node, with no VA behind it.
#[derive(Debug, Serialize)]
pub struct Orphan {
    pub volume: String,
    pub node_id: String,
}

/// One VA with an error on its status: `attach` or `detach`, seconds since
/// it was recorded, its message.
#[derive(Debug, Serialize)]
pub struct StuckError {
    pub volume_attachment: String,
    pub operation: &'static str,
    pub age_seconds: Option<i64>,
    pub message: String,
}

impl Report {
    /// Whether nothing needs attention.
    pub fn is_clean(&self) -> bool {
        self.mismatches.is_empty()
            && self.orphans.is_empty()
            && self.errors.is_empty()
            && self.deleting_pvs.is_empty()
            && self.deleting_vas.is_empty()
    }

    /// The report as text tables (tab-separated).
    pub fn to_text(&self) -> String {
        let mut out = format!(
            "driver {}: {} VolumeAttachments",
            self.driver, self.volume_attachments
        );
        if !self.driver_lists_published_nodes {
            out += " (the driver cannot list published nodes: mismatches not checked)";
        }
        let mut line = |text: String| {
            out.push('\n');
            out += &text;
        };
        if !self.not_in_upstream.is_empty() {
            let flags = self.not_in_upstream.join(" --");
            line(format!("flags upstream v4.12 would refuse (exit 2): --{flags}; remove them before going back (docs/flags.md)"));
        }
        line(format!(
            "Events on PersistentVolumeClaims and Pods: {}",
            self.claim_events
        ));
        if let Some(cleanup) = self.orphan_cleanup {
            line(format!("orphan cleanup (--unpublish-orphans): {cleanup}"));
        }
        if self.is_clean() {
            line("nothing needs attention".into());
        }
        if !self.mismatches.is_empty() {
            line("\nVOLUMEATTACHMENT\tVOLUME\tNODE ID\tATTACHED\tPUBLISHED".into());
        }
        for m in &self.mismatches {
            line(format!(
                "{}\t{}\t{}\t{}\t{}",
                m.volume_attachment, m.volume, m.node_id, m.attached, m.published
            ));
        }
        if !self.orphans.is_empty() {
            line("\nPublished with no VolumeAttachment (orphans; a detach finishing shows here a moment too):\nVOLUME\tNODE ID".into());
        }
        for o in &self.orphans {
            line(format!("{}\t{}", o.volume, o.node_id));
        }
        if !self.errors.is_empty() {
            line("\nVOLUMEATTACHMENT\tOPERATION\tAGE\tERROR".into());
        }
        for e in &self.errors {
            let age = e.age_seconds.map_or("?".to_string(), |s| format!("{s}s"));
            line(format!(
                "{}\t{}\t{age}\t{}",
                e.volume_attachment, e.operation, e.message
            ));
        }
        for (what, names) in [
            ("PersistentVolumes", &self.deleting_pvs),
            ("VolumeAttachments", &self.deleting_vas),
        ] {
            if !names.is_empty() {
                line(format!("\n{what} being deleted with our finalizer:"));
            }
            for n in names {
                line(format!("  {n}"));
            }
        }
        out + "\n"
    }
}

/// This driver's VAs, all PVs and all CSINodes, listed once.
async fn list_objects(
    kube: kube::Client,
    driver: &str,
) -> Result<(Vec<CachedVa>, Vec<CachedPv>, Vec<CSINode>), Error> {
    let all = ListParams::default();
    let list = |what| move |err| Error::Api(what, err);
    let vas = Api::<Wire<CachedVa>>::all(kube.clone()).list(&all).await;
    let vas = vas.map_err(list("volumeattachments"))?.items.into_iter();
    let pvs = Api::<Wire<CachedPv>>::all(kube.clone()).list(&all).await;
    let pvs = pvs.map_err(list("persistentvolumes"))?.items.into_iter();
    let csinodes = Api::<CSINode>::all(kube).list(&all).await;
    Ok((
        vas.map(|va| va.view)
            .filter(|va| va.attacher() == driver)
            .collect(),
        pvs.map(|pv| pv.view).collect(),
        csinodes.map_err(list("csinodes"))?.items,
    ))
}

/// Builds the report with the sidecar's flags.
pub async fn report(config: &Config) -> Result<Report, Error> {
    let address = csi::parse_address(&config.csi_address)?;
    let kube = kube_client::build(
        kube_client::load_config(&config.kubeconfig).await?,
        config.kube_api_qps,
        config.kube_api_burst,
    )?;
    // Nothing serves the calls' metrics: a registry of their own, never named or read.
    let csi_metrics = Arc::new(CsiCallMetrics::new(prometheus::Registry::new()));
    let (client, _) = Client::connect(&address, DIAL_TIMEOUT, config.timeout, csi_metrics).await?;
    client.probe_until_ready().await?;
    let driver = client.plugin_info().await?.name;
    let capabilities = client.capabilities().await?;
    let fin = finalizer(&driver);

    let orphan_cleanup = orphan_cleanup(config, &kube).await;
    let (_, claim_events) = events::claims::reach(&kube).await;
    let (vas, pvs, csinodes) = list_objects(kube, &driver).await?;
    let stores = Stores {
        vas: store_from(vas.iter().cloned()),
        pvs: store_from(pvs.iter().cloned()),
        csinodes: store_from(csinodes),
        pv_refs: PvRefs::default(),
    };

    let mut not_in_upstream = config.not_in_upstream.clone();
    // `--output` is this subcommand's own, not the sidecar's.
    not_in_upstream.retain(|flag| flag != "output");
    let mut report = Report {
        driver: driver.clone(),
        volume_attachments: vas.len(),
        driver_lists_published_nodes: capabilities.can_reconcile(),
        orphan_cleanup,
        claim_events,
        not_in_upstream,
        ..Report::default()
    };
    if report.driver_lists_published_nodes {
        let (published, _pages) = reconcile::list_published(&client, config.max_entries).await?;
        report.mismatches = reconcile::mismatches(&stores, &driver, &published, |_| false)
            .into_iter()
            .map(|m| Mismatch {
                volume_attachment: m.name,
                volume: m.volume,
                node_id: m.node_id,
                attached: m.attached,
                published: !m.attached,
            })
            .collect();
        report.orphans = reconcile::unclaimed(&stores, &driver, &published)
            .into_iter()
            .map(|(volume, node_id)| Orphan { volume, node_id })
            .collect();
    }
    stuck_objects(&mut report, &vas, &pvs, &fin);
    Ok(report)
}

/// With `--unpublish-orphans`, whether the cleanup can run: one GET of a
/// Node says whether RBAC allows it.
async fn orphan_cleanup(config: &Config, kube: &kube::Client) -> Option<&'static str> {
    if !config.unpublish_orphans {
        return None;
    }
    let answer = Api::<Node>::all(kube.clone()).get_opt(PROBE_NODE).await;
    Some(
        match orphans::refused(&answer.map(|_| None).map_err(ApiError)) {
            true => "off: not allowed to get Nodes (deploy/kubernetes/rbac-nodes.yaml)",
            false => "on",
        },
    )
}

/// The VAs' errors and the VAs and PVs being deleted that still hold our
/// finalizer.
fn stuck_objects(report: &mut Report, vas: &[CachedVa], pvs: &[CachedPv], fin: &str) {
    let now = Timestamp::now().as_second();
    for va in vas {
        let status = va.status();
        for (operation, error) in [
            ("attach", status.and_then(|s| s.attach_error())),
            ("detach", status.and_then(|s| s.detach_error())),
        ] {
            if let Some(error) = error {
                report.errors.push(StuckError {
                    volume_attachment: va.name().to_string(),
                    operation,
                    age_seconds: error.time.as_ref().map(|t| (now - t.0.as_second()).max(0)),
                    message: error.message.clone().unwrap_or_default(),
                });
            }
        }
        if va.is_deleting() && va.has_finalizer(fin) {
            report.deleting_vas.push(va.name().to_string());
        }
    }
    report.deleting_pvs = pvs
        .iter()
        .filter(|pv| pv.is_deleting() && pv.has_finalizer(fin))
        .map(|pv| pv.name().to_string())
        .collect();
}
