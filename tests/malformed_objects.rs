//! Hostile and broken Kubernetes objects (docs/malformed-inputs.md, "Objects"):
//! VolumeAttachments, PVs, CSINodes, Secrets and Leases as a user, a controller
//! or a broken tool could write them, against the real API server. One attacher
//! serves every row at once (one VA per row); each row checks where the attacher
//! says what is wrong, or that the value reached the driver unaltered, or that
//! the API server already refuses the object. A good VA created last must attach.

use crate::support;

use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{json, Value};

use support::env::{attach_error_message, Env};
use support::unique;

/// What one row must end in.
#[derive(Debug, Clone)]
enum Expect {
    /// The API server refuses one of the row's objects; its message contains this.
    Rejected(&'static str),
    /// `attachError.message` contains every part (placeholders substituted).
    Error(Vec<String>),
    /// Attached; the Publish call for the row's handle passes `check`.
    Attached(fn(&Value, &VolumeAttachment) -> Result<(), String>),
    /// Not ours: after the good VA attached, this one has no status and no finalizer.
    Ignored,
}

/// One row: objects as JSON with `$DRIVER`, `$NODE`, `$PV`, `$VA`, `$SECRET`,
/// `$NS` placeholders, and what must happen.
struct Row {
    name: &'static str,
    secret: Option<Value>,
    csinode: Option<Value>,
    pv: Option<Value>,
    va: Value,
    /// Delete the PV after creating it (it stays, deleting, held by a finalizer).
    delete_pv: bool,
    expect: Expect,
}

fn csinode(node_id: &str) -> Value {
    json!({"metadata": {"name": "$NODE"}, "spec": {"drivers": [{"name": "$DRIVER", "nodeID": node_id}]}})
}

fn csi_pv(csi_extra: Value, spec_extra: Value) -> Value {
    let mut pv = json!({
        "metadata": {"name": "$PV"},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "csi": {"driver": "$DRIVER", "volumeHandle": "$PV-handle"},
        }
    });
    merge(&mut pv["spec"]["csi"], csi_extra);
    merge(&mut pv["spec"], spec_extra);
    pv
}

fn merge(into: &mut Value, from: Value) {
    if let (Some(into), Value::Object(from)) = (into.as_object_mut(), from) {
        for (k, v) in from {
            if v.is_null() {
                into.remove(&k);
            } else {
                into.insert(k, v);
            }
        }
    }
}

fn pv_va() -> Value {
    json!({"metadata": {"name": "$VA"}, "spec": {"attacher": "$DRIVER", "nodeName": "$NODE", "source": {"persistentVolumeName": "$PV"}}})
}

fn va_with(spec_extra: Value, metadata_extra: Value) -> Value {
    let mut va = pv_va();
    merge(&mut va["spec"], spec_extra);
    merge(&mut va["metadata"], metadata_extra);
    va
}

fn row(name: &'static str, pv: Value, expect: Expect) -> Row {
    Row {
        name,
        secret: None,
        csinode: Some(csinode("$NODE-id")),
        pv: Some(pv),
        va: pv_va(),
        delete_pv: false,
        expect,
    }
}

fn error(parts: &[&str]) -> Expect {
    Expect::Error(parts.iter().map(|p| p.to_string()).collect())
}

fn rows() -> Vec<Row> {
    let mib = "m".repeat(1 << 20);
    let big_secret = base64::engine::general_purpose::STANDARD.encode("s".repeat(1 << 20));
    let inline = |csi: Value| json!({"inlineVolumeSpec": {"accessModes": ["ReadWriteOnce"], "csi": csi}, "persistentVolumeName": null});
    vec![
        Row {
            pv: None,
            ..row(
                "va_names_a_missing_pv",
                Value::Null,
                error(&["persistentvolume \"$PV\" not found"]),
            )
        },
        row(
            "pv_without_csi_source_nfs",
            json!({"metadata": {"name": "$PV"}, "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "nfs": {"server": "127.0.0.1", "path": "/x"}}}),
            error(&["pv spec contained non-csi source that was not migrated"]),
        ),
        row(
            "pv_of_another_csi_driver",
            csi_pv(json!({"driver": "other.csi.example.com"}), json!({})),
            Expect::Attached(|publish, _| eq(&publish["volume_id"], &json!("$PV-handle"))),
        ),
        row(
            "pv_empty_volume_handle",
            csi_pv(json!({"volumeHandle": ""}), json!({})),
            Expect::Rejected("volumeHandle"),
        ),
        row(
            "pv_volume_handle_unicode_slashes_and_2000_chars",
            csi_pv(
                json!({"volumeHandle": format!("$PV-handle/🔑/../{}", "h".repeat(2000))}),
                json!({}),
            ),
            Expect::Attached(|publish, _| {
                let id = publish["volume_id"].as_str().unwrap_or_default();
                (id.contains("/🔑/../") && id.len() > 2000)
                    .then_some(())
                    .ok_or(format!("volume_id {id:.80}"))
            }),
        ),
        row(
            "pv_volume_attributes_1MiB_value",
            csi_pv(json!({"volumeAttributes": {"big": mib}}), json!({})),
            Expect::Attached(|publish, _| {
                let len = publish["volume_context"]["big"]
                    .as_str()
                    .map_or(0, str::len);
                (len == 1 << 20)
                    .then_some(())
                    .ok_or(format!("volume_context.big is {len} bytes"))
            }),
        ),
        row(
            "pv_volume_attributes_hostile_keys",
            csi_pv(
                json!({"volumeAttributes": {"": "empty", "a b": "space", "ключ": "🔑", "x\ny": "newline", "k": ""}}),
                json!({}),
            ),
            Expect::Attached(|publish, _| {
                eq(
                    &publish["volume_context"],
                    &json!({"": "empty", "a b": "space", "ключ": "🔑", "x\ny": "newline", "k": ""}),
                )
            }),
        ),
        row(
            "pv_access_modes_rox_and_rwo",
            csi_pv(
                json!({}),
                json!({"accessModes": ["ReadOnlyMany", "ReadWriteOnce"]}),
            ),
            error(&[
                "CSI does not support ReadOnlyMany and ReadWriteOnce on the same PersistentVolume",
            ]),
        ),
        row(
            "pv_access_mode_unknown",
            csi_pv(json!({}), json!({"accessModes": ["ReadWriteSometimes"]})),
            Expect::Rejected("accessModes"),
        ),
        row(
            "pv_access_modes_empty",
            csi_pv(json!({}), json!({"accessModes": []})),
            Expect::Rejected("accessModes"),
        ),
        row(
            "pv_access_modes_rwop_with_rwo",
            csi_pv(
                json!({}),
                json!({"accessModes": ["ReadWriteOncePod", "ReadWriteOnce"]}),
            ),
            Expect::Rejected("ReadWriteOncePod"),
        ),
        row(
            "pv_volume_mode_unknown",
            csi_pv(json!({}), json!({"volumeMode": "Tape"})),
            Expect::Rejected("volumeMode"),
        ),
        row(
            "pv_mount_options_hostile",
            csi_pv(
                json!({}),
                json!({"mountOptions": ["ro;rm -rf /", "a\nb", "x=y,z", ""]}),
            ),
            Expect::Attached(|publish, _| {
                eq(
                    &publish["capability"]["mount_flags"],
                    &json!(["ro;rm -rf /", "a\nb", "x=y,z", ""]),
                )
            }),
        ),
        row(
            "pv_fs_type_hostile",
            csi_pv(json!({"fsType": "ext4 --force; 🔑"}), json!({})),
            Expect::Attached(|publish, _| {
                eq(
                    &publish["capability"]["fs_type"],
                    &json!("ext4 --force; 🔑"),
                )
            }),
        ),
        Row {
            delete_pv: true,
            ..row(
                "pv_being_deleted",
                {
                    let mut pv = csi_pv(json!({}), json!({}));
                    pv["metadata"]["finalizers"] = json!(["example.com/hold"]);
                    pv
                },
                error(&["PersistentVolume \"$PV\" is marked for deletion"]),
            )
        },
        Row {
            csinode: None,
            ..row(
                "csinode_missing",
                csi_pv(json!({}), json!({})),
                error(&["csinode.storage.k8s.io \"$NODE\" not found"]),
            )
        },
        Row {
            csinode: Some(
                json!({"metadata": {"name": "$NODE"}, "spec": {"drivers": [{"name": "other.csi.example.com", "nodeID": "x"}]}}),
            ),
            ..row(
                "csinode_without_our_driver",
                csi_pv(json!({}), json!({})),
                error(&["CSINode $NODE does not contain driver $DRIVER"]),
            )
        },
        Row {
            csinode: Some(json!({"metadata": {"name": "$NODE"}, "spec": {"drivers": []}})),
            ..row(
                "csinode_without_any_driver",
                csi_pv(json!({}), json!({})),
                error(&["CSINode $NODE does not contain driver $DRIVER"]),
            )
        },
        Row {
            csinode: Some(csinode("")),
            ..row(
                "csinode_empty_node_id",
                csi_pv(json!({}), json!({})),
                Expect::Rejected("nodeID"),
            )
        },
        Row {
            csinode: Some(csinode("$NODE/../etc;🔑 id")),
            ..row(
                "csinode_node_id_hostile",
                csi_pv(json!({}), json!({})),
                Expect::Attached(|publish, va| {
                    let id = publish["node_id"].as_str().unwrap_or_default();
                    let annotation = va
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get("csi.alpha.kubernetes.io/node-id"));
                    (id == "$NODE/../etc;🔑 id" && annotation.map(String::as_str) == Some(id))
                        .then_some(())
                        .ok_or(format!("node_id {id:?}, annotation {annotation:?}"))
                }),
            )
        },
        Row {
            va: va_with(json!({"nodeName": "Node_With_Caps"}), json!({})),
            ..row(
                "va_node_name_not_dns",
                csi_pv(json!({}), json!({})),
                Expect::Rejected("nodeName"),
            )
        },
        Row {
            va: va_with(json!({"nodeName": ""}), json!({})),
            ..row(
                "va_node_name_empty",
                csi_pv(json!({}), json!({})),
                Expect::Rejected("nodeName"),
            )
        },
        Row {
            va: va_with(json!({"nodeName": "n".repeat(300)}), json!({})),
            ..row(
                "va_node_name_300_chars",
                csi_pv(json!({}), json!({})),
                Expect::Rejected("nodeName"),
            )
        },
        Row {
            va: va_with(json!({"source": {}}), json!({})),
            ..row(
                "va_source_neither_pv_nor_inline",
                csi_pv(json!({}), json!({})),
                Expect::Rejected("source"),
            )
        },
        Row {
            va: va_with(
                json!({"source": {"persistentVolumeName": "$PV", "inlineVolumeSpec": {"accessModes": ["ReadWriteOnce"], "csi": {"driver": "$DRIVER", "volumeHandle": "h"}}}}),
                json!({}),
            ),
            ..row(
                "va_source_both_pv_and_inline",
                csi_pv(json!({}), json!({})),
                Expect::Rejected("source"),
            )
        },
        Row {
            pv: None,
            va: va_with(
                json!({"source": inline(json!({"driver": "$DRIVER", "volumeHandle": ""}))}),
                json!({}),
            ),
            ..row(
                "va_inline_empty_volume_handle",
                Value::Null,
                Expect::Rejected("volumeHandle"),
            )
        },
        Row {
            pv: None,
            va: va_with(
                json!({"source": {"inlineVolumeSpec": {"accessModes": ["ReadWriteOnce"], "nfs": {"server": "127.0.0.1", "path": "/x"}}}}),
                json!({}),
            ),
            ..row(
                "va_inline_without_csi_source",
                Value::Null,
                Expect::Rejected("inlineVolumeSpec"),
            )
        },
        Row {
            pv: None,
            va: va_with(
                json!({"source": inline(json!({"driver": "$DRIVER", "volumeHandle": "$PV-handle", "volumeAttributes": {"k": "v"}}))}),
                json!({}),
            ),
            ..row(
                "va_inline_csi_source",
                Value::Null,
                Expect::Attached(|publish, _| eq(&publish["volume_context"], &json!({"k": "v"}))),
            )
        },
        Row {
            va: va_with(
                json!({}),
                json!({"annotations": {"csi.alpha.kubernetes.io/node-id": "evil-node"}}),
            ),
            ..row(
                "va_node_id_annotation_forged",
                csi_pv(json!({}), json!({})),
                Expect::Attached(|publish, va| {
                    let annotation = va
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get("csi.alpha.kubernetes.io/node-id"))
                        .cloned();
                    let id = publish["node_id"].as_str().map(String::from);
                    (id.as_deref().is_some_and(|i| i.ends_with("-id")) && annotation == id)
                        .then_some(())
                        .ok_or(format!("node_id {id:?}, annotation {annotation:?}"))
                }),
            )
        },
        Row {
            va: va_with(
                json!({}),
                json!({"annotations": {"example.com/huge": "a".repeat(200 << 10), "example.com/ctl": "\u{1b}[31m\n\t"}}),
            ),
            ..row(
                "va_hostile_annotations_200KiB",
                csi_pv(json!({}), json!({})),
                Expect::Attached(|_, va| {
                    let kept = va
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get("example.com/huge"))
                        .map_or(0, String::len);
                    (kept == 200 << 10)
                        .then_some(())
                        .ok_or(format!("annotation now {kept} bytes"))
                }),
            )
        },
        Row {
            va: va_with(
                json!({}),
                json!({"finalizers": ["example.com/keep", "example.com/keep-2"]}),
            ),
            ..row(
                "va_foreign_finalizers",
                csi_pv(json!({}), json!({})),
                Expect::Attached(|_, va| {
                    let f = va.metadata.finalizers.clone().unwrap_or_default();
                    (f.len() == 3 && f[0] == "example.com/keep" && f[1] == "example.com/keep-2")
                        .then_some(())
                        .ok_or(format!("finalizers {f:?}"))
                }),
            )
        },
        Row {
            va: va_with(json!({"attacher": "other.csi.example.com"}), json!({})),
            ..row(
                "va_of_another_driver",
                csi_pv(json!({}), json!({})),
                Expect::Ignored,
            )
        },
        Row {
            va: va_with(json!({"attacher": "Not A Driver!"}), json!({})),
            ..row(
                "va_attacher_not_a_driver_name",
                csi_pv(json!({}), json!({})),
                Expect::Rejected("attacher"),
            )
        },
        row(
            "secret_ref_to_missing_secret",
            csi_pv(
                json!({"controllerPublishSecretRef": {"namespace": "default", "name": "$SECRET"}}),
                json!({}),
            ),
            error(&["failed to load secret \"default/$SECRET\"", "not found"]),
        ),
        row(
            "secret_ref_to_missing_namespace",
            csi_pv(
                json!({"controllerPublishSecretRef": {"namespace": "$NS", "name": "$SECRET"}}),
                json!({}),
            ),
            error(&["failed to load secret \"$NS/$SECRET\"", "not found"]),
        ),
        row(
            "secret_ref_without_namespace",
            csi_pv(
                json!({"controllerPublishSecretRef": {"name": "$SECRET"}}),
                json!({}),
            ),
            Expect::Rejected("namespace"),
        ),
        Row {
            secret: Some(
                json!({"metadata": {"name": "$SECRET"}, "data": {"password": big_secret}}),
            ),
            ..row(
                "secret_value_1MiB",
                csi_pv(
                    json!({"controllerPublishSecretRef": {"namespace": "default", "name": "$SECRET"}}),
                    json!({}),
                ),
                Expect::Attached(|publish, _| {
                    let len = publish["secrets"]["password"].as_str().map_or(0, str::len);
                    (len == 1 << 20)
                        .then_some(())
                        .ok_or(format!("secret reached the driver with {len} bytes"))
                }),
            )
        },
        Row {
            secret: Some(json!({"metadata": {"name": "$SECRET"}, "data": {"": "", "k": ""}})),
            ..row(
                "secret_with_empty_values",
                csi_pv(
                    json!({"controllerPublishSecretRef": {"namespace": "default", "name": "$SECRET"}}),
                    json!({}),
                ),
                Expect::Rejected("data"),
            )
        },
    ]
}

fn eq(got: &Value, want: &Value) -> Result<(), String> {
    (got == want)
        .then_some(())
        .ok_or(format!("got {got:.200}, want {want:.200}"))
}

/// Names of one row's objects.
struct Names {
    node: String,
    pv: String,
    va: String,
    secret: String,
    ns: String,
}

impl Names {
    fn new() -> Self {
        Self {
            node: unique("node"),
            pv: unique("pv"),
            va: unique("va"),
            secret: unique("secret"),
            ns: unique("no-such-ns"),
        }
    }

    fn fill(&self, driver: &str, template: &Value) -> Value {
        let text = template
            .to_string()
            .replace("$DRIVER", driver)
            .replace("$NODE", &self.node)
            .replace("$PV", &self.pv)
            .replace("$VA", &self.va)
            .replace("$SECRET", &self.secret)
            .replace("$NS", &self.ns);
        serde_json::from_str(&text).expect("row JSON")
    }

    /// `value` with this row's names put back as placeholders, for comparing with a row.
    fn unfill(&self, driver: &str, value: &Value) -> Value {
        let text = value
            .to_string()
            .replace(&self.node, "$NODE")
            .replace(&self.pv, "$PV")
            .replace(driver, "$DRIVER");
        serde_json::from_str(&text).expect("JSON")
    }
}

async fn create<K>(api: &Api<K>, object: Value) -> Result<(), String>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
{
    let object: K =
        serde_json::from_value(object).map_err(|e| format!("not a valid object: {e}"))?;
    api.create(&PostParams::default(), &object)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Creates a row's objects; `Err` is the API server's refusal.
async fn create_row(env: &Env, row: &Row, names: &Names) -> Result<(), String> {
    if let Some(secret) = &row.secret {
        let api: Api<k8s_openapi::api::core::v1::Secret> =
            Api::namespaced(env.client.clone(), "default");
        create(&api, names.fill(&env.driver, secret)).await?;
    }
    if let Some(csinode) = &row.csinode {
        create::<CSINode>(&env.csinodes, names.fill(&env.driver, csinode)).await?;
    }
    if let Some(pv) = &row.pv {
        create::<PersistentVolume>(&env.pvs, names.fill(&env.driver, pv)).await?;
        if row.delete_pv {
            env.pvs
                .delete(&names.pv, &DeleteParams::default())
                .await
                .map_err(|e| e.to_string())?;
        }
    }
    create::<VolumeAttachment>(&env.vas, names.fill(&env.driver, &row.va)).await
}

#[tokio::test]
async fn hostile_objects_get_a_clear_error_or_reach_the_driver_unaltered() {
    let env = Env::start(
        &[],
        &["--retry-interval-start=500ms", "--retry-interval-max=2s"],
    )
    .await;
    let rows = rows();
    let mut created = Vec::new();
    for row in &rows {
        let names = Names::new();
        let result = create_row(&env, row, &names).await;
        match (&row.expect, result) {
            (Expect::Rejected(part), Err(message)) => {
                assert!(
                    message.contains(part),
                    "{}: refused, but {message:?} lacks {part:?}",
                    row.name
                );
            }
            (Expect::Rejected(_), Ok(())) => panic!("{}: the API server accepted it", row.name),
            (_, Err(message)) => {
                panic!("{}: the API server refused an object: {message}", row.name)
            }
            (_, Ok(())) => created.push((row, names)),
        }
    }
    // A good VA after all of them: nothing above blocks it.
    let good = env.attached().await;

    for (row, names) in &created {
        match &row.expect {
            Expect::Rejected(_) => {}
            Expect::Error(parts) => {
                let va = env.wait_attach_error(&names.va).await;
                let message = attach_error_message(&va).unwrap_or_default();
                for part in parts {
                    let part = names.fill(&env.driver, &json!(part));
                    let part = part.as_str().unwrap_or_default();
                    assert!(
                        message.contains(part),
                        "{}: attachError {message:?} lacks {part:?}",
                        row.name
                    );
                }
                let status = va.status.unwrap_or_default();
                assert!(!status.attached, "{}: attached", row.name);
                assert!(
                    status.attach_error.and_then(|e| e.error_code).is_none(),
                    "{}: errorCode on a non-driver error",
                    row.name
                );
            }
            Expect::Attached(check) => {
                let va = env.wait_attached(&names.va).await;
                let handle_part = names.pv.clone();
                let calls = env.mock.calls("ControllerPublishVolume").await;
                let publish = calls
                    .iter()
                    .find(|c| {
                        c["volume_id"]
                            .as_str()
                            .is_some_and(|v| v.contains(&handle_part))
                    })
                    .unwrap_or_else(|| panic!("{}: no Publish for {handle_part}", row.name));
                let publish = names.unfill(&env.driver, publish);
                let va: VolumeAttachment = serde_json::from_value(
                    names.unfill(&env.driver, &serde_json::to_value(&va).expect("VA JSON")),
                )
                .expect("VA");
                if let Err(why) = check(&publish, &va) {
                    panic!("{}: {why}", row.name);
                }
            }
            Expect::Ignored => {
                let va = env.vas.get(&names.va).await.expect("VA");
                // The API server itself writes `attached: false`; nothing else may appear.
                let status = va.status.clone().unwrap_or_default();
                assert!(
                    !status.attached && status.attach_error.is_none(),
                    "{}: status written: {status:?}",
                    row.name
                );
                assert!(
                    va.metadata.finalizers.is_none(),
                    "{}: finalizer added",
                    row.name
                );
            }
        }
    }
    let good = env.vas.get(&good.va).await.expect("good VA");
    assert!(good.status.is_some_and(|s| s.attached));
    let logs = env.logs();
    assert!(!logs.contains("panicked"), "a panic in the log");
    assert!(
        !logs.contains("internal error"),
        "a caught panic in the log"
    );
}

/// A publish secret whose value is not UTF-8 cannot be passed to the driver
/// (CSI secrets are strings): a clear attachError naming the secret and key,
/// never the value, and no lossy copy sent to the driver.
#[tokio::test]
async fn a_secret_value_that_is_not_utf8_is_a_clear_error_without_the_value() {
    let env = Env::start(
        &[],
        &["--retry-interval-start=500ms", "--retry-interval-max=2s"],
    )
    .await;
    let secret = unique("secret");
    let value = base64::engine::general_purpose::STANDARD.encode([0xff, 0xfe, b'p', b'w']);
    env.create_secret(&secret, json!({"password": value})).await;
    let volume =
        support::objects::pv(&unique("pv"), &env.driver).publish_secret("default", &secret);
    let a = env.create_attachment(volume).await;
    let va = env.wait_attach_error(&a.va).await;
    let message = attach_error_message(&va).unwrap_or_default();
    assert!(message.contains(&format!("default/{secret}")), "{message}");
    assert!(message.contains("UTF-8"), "{message}");
    assert!(
        !message.contains("pw") && !message.contains('\u{fffd}'),
        "value leaked: {message}"
    );
    assert!(
        env.mock.calls("ControllerPublishVolume").await.is_empty(),
        "a lossy secret reached the driver"
    );
}

/// Detach rows: the VA is attached first, then something is broken, then it is deleted.
#[tokio::test]
async fn detach_with_broken_objects_says_why_or_falls_back() {
    let env = Env::start(
        &[],
        &["--retry-interval-start=500ms", "--retry-interval-max=2s"],
    )
    .await;
    type Break = fn(&Env, &support::env::Attachment) -> futures::future::BoxFuture<'static, ()>;
    // (row, what breaks, detachError parts; empty = the VA must go)
    let rows: Vec<(&str, Break, &[&str])> = vec![
        (
            "detach_after_csinode_deleted_uses_the_annotation",
            |env, a| {
                let (api, node) = (env.csinodes.clone(), a.node.clone());
                Box::pin(async move {
                    api.delete(&node, &DeleteParams::default())
                        .await
                        .expect("delete CSINode");
                })
            },
            &[],
        ),
        (
            "detach_after_csinode_and_annotation_deleted",
            |env, a| {
                let (api, vas, node, va) = (
                    env.csinodes.clone(),
                    env.vas.clone(),
                    a.node.clone(),
                    a.va.clone(),
                );
                Box::pin(async move {
                    api.delete(&node, &DeleteParams::default())
                        .await
                        .expect("delete CSINode");
                    let patch = json!({"metadata": {"annotations": {"csi.alpha.kubernetes.io/node-id": null}}});
                    vas.patch(&va, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .expect("strip annotation");
                })
            },
            &["csinode.storage.k8s.io", "not found"],
        ),
        (
            "detach_with_forged_annotation_uses_the_csinode",
            |env, a| {
                let (vas, va) = (env.vas.clone(), a.va.clone());
                Box::pin(async move {
                    let patch = json!({"metadata": {"annotations": {"csi.alpha.kubernetes.io/node-id": "evil"}}});
                    vas.patch(&va, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .expect("forge annotation");
                })
            },
            &[],
        ),
        (
            "detach_after_pv_force_deleted",
            |env, a| {
                let (pvs, pv) = (env.pvs.clone(), a.pv.clone());
                Box::pin(async move {
                    let patch = json!({"metadata": {"finalizers": null}});
                    pvs.patch(&pv, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .expect("strip PV finalizers");
                    pvs.delete(&pv, &DeleteParams::default())
                        .await
                        .expect("delete PV");
                })
            },
            &["persistentvolume", "not found"],
        ),
    ];
    for (name, breaks, parts) in rows {
        let a = env.attached().await;
        breaks(&env, &a).await;
        // Let the cache see the change before the delete.
        support::quiet_period(Duration::from_millis(300)).await;
        env.delete_va(&a.va).await;
        if parts.is_empty() {
            env.wait_gone(&a.va).await;
            let unpublish = env.mock.calls("ControllerUnpublishVolume").await;
            let ours: Vec<_> = unpublish
                .iter()
                .filter(|c| c["volume_id"] == a.handle)
                .collect();
            assert!(
                ours.iter()
                    .any(|c| c["node_id"] == json!(format!("{}-id", a.node))),
                "{name}: no Unpublish from the node's real ID: {ours:?}"
            );
        } else {
            let va = env
                .wait_va(&a.va, "detach failed", |va| {
                    va.and_then(|v| v.status.as_ref())
                        .is_some_and(|s| s.detach_error.is_some())
                })
                .await
                .expect("VA kept by our finalizer");
            let message = va
                .status
                .and_then(|s| s.detach_error)
                .and_then(|e| e.message)
                .unwrap_or_default();
            for part in parts {
                assert!(
                    message.contains(part),
                    "{name}: detachError {message:?} lacks {part:?}"
                );
            }
            assert!(
                va.metadata
                    .finalizers
                    .unwrap_or_default()
                    .contains(&env.finalizer),
                "{name}: the detach is still owed"
            );
        }
    }
    assert!(!env.logs().contains("panicked"));
}

/// Leases as a crashed or broken replica left them: the attacher takes over.
#[tokio::test]
async fn hostile_leases_are_taken_over() {
    let rows: Vec<(&str, Value)> = vec![
        (
            "lease_held_by_a_ghost_long_expired",
            json!({"holderIdentity": "ghost", "leaseDurationSeconds": 1, "renewTime": "2001-01-01T00:00:00.000000Z"}),
        ),
        (
            "lease_with_empty_holder",
            json!({"holderIdentity": "", "leaseDurationSeconds": 15}),
        ),
        (
            "lease_renewed_in_the_year_2999",
            json!({"holderIdentity": "ghost", "leaseDurationSeconds": 1, "renewTime": "2999-01-01T00:00:00.000000Z", "acquireTime": "2999-01-01T00:00:00.000000Z"}),
        ),
        (
            "lease_without_duration_or_times",
            json!({"holderIdentity": "ghost"}),
        ),
    ];
    for (name, spec) in rows {
        let env = Env::without_attacher(&[]).await;
        let leases: Api<Lease> = Api::namespaced(env.client.clone(), "default");
        let lease_name = format!("external-attacher-leader-{}", env.driver.replace('.', "-"));
        let lease: Lease =
            serde_json::from_value(json!({"metadata": {"name": lease_name}, "spec": spec}))
                .expect("lease JSON");
        leases
            .create(&PostParams::default(), &lease)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let kubeconfig = env.cp.kubeconfig.clone();
        let env = env.with_attacher(
            &kubeconfig,
            &[
                "--leader-election",
                "--leader-election-namespace=default",
                "--leader-election-lease-duration=2s",
                "--leader-election-renew-deadline=1s",
                "--leader-election-retry-period=200ms",
            ],
        );
        let a = env
            .create_attachment(support::objects::pv(&unique("pv"), &env.driver))
            .await;
        env.wait_attached(&a.va).await;
        let held = leases.get(&lease_name).await.expect("lease");
        let holder = held
            .spec
            .and_then(|s| s.holder_identity)
            .unwrap_or_default();
        assert!(
            !holder.is_empty() && holder != "ghost",
            "{name}: holder {holder:?}"
        );
        assert!(!env.logs().contains("panicked"), "{name}");
    }
}

/// In-tree AWS EBS PVs (migrated to `ebs.csi.aws.com`) with hostile volume IDs
/// and zones: translated as `k8s.io/csi-translation-lib` does, or refused with
/// its error; never a panic.
#[tokio::test]
async fn in_tree_pvs_with_hostile_ids_translate_or_fail_clearly() {
    let env = Env::named_without_attacher("ebs.csi.aws.com", &[]).await;
    let kubeconfig = env.cp.kubeconfig.clone();
    let env = env.with_attacher(
        &kubeconfig,
        &["--retry-interval-start=500ms", "--retry-interval-max=2s"],
    );
    // (row, volumeID, zone label, Ok(volume_id sent) or Err(attachError part))
    let rows: Vec<(&str, &str, &str, Result<&str, &str>)> = vec![
        (
            "aws_volume_id_with_percent_and_euro",
            "aws://z/vol-%€",
            "z",
            Err("failed to translate in tree pv to CSI"),
        ),
        (
            "aws_volume_id_empty_zone",
            "aws:///vol-0123",
            "us-east-1a",
            Ok("vol-0123"),
        ),
        (
            "aws_volume_id_without_volume",
            "aws://us-east-1a/",
            "us-east-1a",
            Err("failed to translate in tree pv to CSI"),
        ),
        (
            "aws_volume_id_plain_name_with_unicode",
            "vol-🔑",
            "us-east-1a",
            Ok("vol-🔑"),
        ),
        // As csi-translation-lib: an ID without aws:// is taken as a bare volume ID.
        (
            "aws_volume_id_other_scheme",
            "gcs://bucket/vol-1",
            "us-east-1a",
            Ok("gcs://bucket/vol-1"),
        ),
        (
            "aws_zone_label_with_double_underscore",
            "aws://us-east-1a/vol-1",
            "a__b",
            Ok("vol-1"),
        ),
    ];
    let mut started = Vec::new();
    for (name, volume_id, zone, want) in &rows {
        let node = unique("node");
        env.create_node(&node).await;
        let pv_name = unique("pv");
        let pv: PersistentVolume = serde_json::from_value(json!({
            "metadata": {
                "name": pv_name,
                "labels": {"topology.kubernetes.io/zone": zone},
                "annotations": {"pv.kubernetes.io/migrated-to": "ebs.csi.aws.com"},
            },
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "awsElasticBlockStore": {"volumeID": volume_id},
            },
        }))
        .expect("PV JSON");
        if let Err(err) = env.pvs.create(&PostParams::default(), &pv).await {
            panic!("{name}: PV refused: {err}");
        }
        let va_name = unique("va");
        env.create_va(
            support::objects::va(&va_name, &env.driver, &node)
                .pv(&pv_name)
                .build(),
        )
        .await;
        started.push((name, va_name, want));
    }
    let mut wrong = Vec::new();
    for (name, va_name, want) in started {
        let va = env
            .wait_va(&va_name, "failed or attached", |va| {
                va.and_then(|v| v.status.as_ref())
                    .is_some_and(|s| s.attached || s.attach_error.is_some())
            })
            .await
            .expect("VA");
        let message = attach_error_message(&va);
        let attached = va.status.as_ref().is_some_and(|s| s.attached);
        let calls = env.mock.calls("ControllerPublishVolume").await;
        let node_id = va
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("csi.alpha.kubernetes.io/node-id"))
            .cloned()
            .unwrap_or_default();
        let sent = calls
            .iter()
            .find(|c| c["node_id"] == json!(node_id))
            .and_then(|c| c["volume_id"].as_str().map(String::from));
        let ok = match want {
            Ok(volume) => attached && sent.as_deref() == Some(*volume),
            Err(part) => !attached && message.as_deref().is_some_and(|m| m.contains(part)),
        };
        if !ok {
            wrong.push(format!(
                "{name}: attached={attached} sent={sent:?} attachError={message:?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "rows:\n{}", wrong.join("\n"));
    assert!(!env.logs().contains("panicked"));
}
