//! Property test: `src/migration` against Kubernetes' own
//! k8s.io/csi-translation-lib (hack/tools/csi-translate) on generated
//! in-tree PVs of all seven plugins, with adversarial volume IDs, zones,
//! labels, node affinity, annotations and claim refs, and on generated
//! GCE handle repairs. Both sides must produce the same PV (compared after
//! Go's `omitempty`) or the same error text.
//!
//! Cases: 256 by default, `PROPTEST_CASES` for more (`hack/properties.sh`).

use crate::support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Mutex, OnceLock};

use csi_attacher::migration;
use proptest::prelude::*;
use serde_json::{json, Map, Value};

use support::translation::{canonical, rust_output};

/// One long-lived csi-translate process, one JSON line per question.
struct Translator {
    _child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Translator {
    fn start() -> Translator {
        let binary = support::controlplane::tools_dir()
            .expect("tools dir")
            .join("csi-translate");
        let mut child = Command::new(&binary)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Translator {
            _child: child,
            stdin,
            stdout,
        }
    }

    fn ask(&mut self, input: &Value) -> Value {
        let mut line = serde_json::to_vec(input).expect("json");
        line.push(b'\n');
        self.stdin.write_all(&line).expect("write to csi-translate");
        self.stdin.flush().expect("flush");
        let mut answer = String::new();
        self.stdout
            .read_line(&mut answer)
            .expect("read from csi-translate");
        assert!(!answer.is_empty(), "csi-translate ended");
        serde_json::from_str(&answer).expect("csi-translate answer")
    }
}

fn translator() -> &'static Mutex<Translator> {
    static GO: OnceLock<Mutex<Translator>> = OnceLock::new();
    GO.get_or_init(|| Mutex::new(Translator::start()))
}

// ---- generators ----

/// Pieces that exercise URL parsing, zone splitting, quoting and trimming.
fn fragment() -> BoxedStrategy<String> {
    prop_oneof![
        4 => prop::sample::select(vec![
            "vol-", "vol-0123abc", "aws://", "aws:", "//", "/", "%", "%2F", "%2f", "%41", "%zz",
            "%e2%82", "%25", "%0", "?", "#", "[", "]", "[::1]", "[fe80::1%25en0]", ":", ":80",
            ":x", "@", "user@", "-", "__", " ", "\t", "é", "€", "\u{0}", "\u{7f}", "\u{1F600}",
            "us-east-1a", "us-central1-a", "us-central1", "europe-west1-b", "a-b-c", "UNSPECIFIED",
            "projects", "zones", "regions", "disks", "instances", ".", "..", "\\", "\"", "'", "<",
            "Managed", "managed", "Shared", "Dedicated", "azure-storage-account-", "-secret",
            "x", "1", "0", "a b@", "%zz@", "u:p@", "@@", "[1.2.3.4]", "[::ffff:1.2.3.4]",
            "[fe80::1%25%41]", "[::1%25]", "[::1%25%0a]", "[%31::]", "%25", "1.2.3.4", "::",
        ])
        .prop_map(str::to_owned),
        1 => "[a-z0-9]{1,6}",
        1 => any::<char>().prop_map(String::from),
    ]
    .boxed()
}

fn adversarial() -> BoxedStrategy<String> {
    prop_oneof![
        6 => prop::collection::vec(fragment(), 0..8).prop_map(|f| f.concat()),
        1 => ".{0,12}",
        // Long inputs (the limits of what the API server stores are not ours to enforce).
        1 => (fragment(), 100usize..3000).prop_map(|(f, n)| f.repeat(n)),
    ]
    .boxed()
}

fn zone() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec![
            "us-central1-a", "us-central1-b", "us-east1-c", "europe-west1-b", "a-b-c", "us-east-1a",
        ])
        .prop_map(str::to_owned),
        1 => adversarial(),
    ]
}

/// A zone label value: one zone, several joined with `__`, or anything.
fn zone_label() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => zone(),
        2 => prop::collection::vec(zone(), 0..4).prop_map(|z| z.join("__")),
        1 => adversarial(),
    ]
}

const ZONE_KEYS: [&str; 4] = [
    "topology.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/region",
];

fn labels() -> impl Strategy<Value = Value> {
    (
        prop::collection::vec(
            (prop::sample::select(ZONE_KEYS.to_vec()), zone_label()),
            0..4,
        ),
        prop::option::of((adversarial(), adversarial())),
    )
        .prop_map(|(zones, other)| {
            let mut m = Map::new();
            for (k, v) in zones {
                m.insert(k.to_owned(), json!(v));
            }
            if let Some((k, v)) = other {
                m.insert(k, json!(v));
            }
            Value::Object(m)
        })
}

fn requirement() -> impl Strategy<Value = Value> {
    (
        prop_oneof![
            4 => prop::sample::select(ZONE_KEYS.to_vec()).prop_map(str::to_owned),
            1 => adversarial(),
        ],
        prop::sample::select(vec!["In", "NotIn", "Exists"]),
        prop::option::of(prop::collection::vec(zone(), 0..3)),
    )
        .prop_map(|(key, operator, values)| {
            let mut r = json!({"key": key, "operator": operator});
            if let Some(values) = values {
                r["values"] = json!(values);
            }
            r
        })
}

fn node_affinity() -> impl Strategy<Value = Option<Value>> {
    prop::option::weighted(
        0.4,
        prop::collection::vec(
            prop::option::of(prop::collection::vec(requirement(), 0..3)),
            0..3,
        )
        .prop_map(|terms| {
            let terms: Vec<Value> = terms
                .into_iter()
                .map(|t| match t {
                    Some(exprs) => json!({"matchExpressions": exprs}),
                    None => json!({}),
                })
                .collect();
            json!({"required": {"nodeSelectorTerms": terms}})
        }),
    )
}

fn access_modes() -> impl Strategy<Value = Option<Vec<&'static str>>> {
    prop::option::of(prop::collection::vec(
        prop::sample::select(vec![
            "ReadWriteOnce",
            "ReadOnlyMany",
            "ReadWriteMany",
            "ReadWriteOncePod",
        ]),
        0..3,
    ))
}

fn opt_string() -> impl Strategy<Value = Option<String>> {
    prop::option::of(adversarial())
}

/// The in-tree source of one of the seven plugins (or none / CSI), as
/// `(field name, value)`.
fn source() -> BoxedStrategy<(String, Value)> {
    let aws_id = prop_oneof![
        3 => (zone(), adversarial()).prop_map(|(z, v)| format!("aws://{z}/{v}")),
        1 => adversarial().prop_map(|v| format!("aws://{v}")),
        1 => adversarial(),
    ];
    prop_oneof![
        (
            adversarial(),
            prop::option::of(-3i32..300),
            any::<bool>(),
            opt_string()
        )
            .prop_map(|(pd, partition, ro, fs)| {
                let mut s = json!({"pdName": pd, "readOnly": ro});
                if let Some(p) = partition {
                    s["partition"] = json!(p);
                }
                if let Some(fs) = fs {
                    s["fsType"] = json!(fs);
                }
                ("gcePersistentDisk".to_owned(), s)
            })
            .boxed(),
        (
            aws_id,
            prop::option::of(-3i32..300),
            any::<bool>(),
            opt_string()
        )
            .prop_map(|(id, partition, ro, fs)| {
                let mut s = json!({"volumeID": id, "readOnly": ro});
                if let Some(p) = partition {
                    s["partition"] = json!(p);
                }
                if let Some(fs) = fs {
                    s["fsType"] = json!(fs);
                }
                ("awsElasticBlockStore".to_owned(), s)
            })
            .boxed(),
        (adversarial(), any::<bool>(), opt_string())
            .prop_map(|(id, ro, fs)| {
                let mut s = json!({"volumeID": id, "readOnly": ro});
                if let Some(fs) = fs {
                    s["fsType"] = json!(fs);
                }
                ("cinder".to_owned(), s)
            })
            .boxed(),
        (
            adversarial(),
            adversarial(),
            prop::option::of(prop_oneof![
                prop::sample::select(vec![
                    "Managed",
                    "managed",
                    "MANAGED",
                    "Shared",
                    "Dedicated",
                    ""
                ])
                .prop_map(str::to_owned),
                adversarial()
            ]),
            opt_string(),
            opt_string(),
            any::<bool>()
        )
            .prop_map(|(name, uri, kind, caching, fs, ro)| {
                let mut s = json!({"diskName": name, "diskURI": uri, "readOnly": ro});
                if let Some(k) = kind {
                    s["kind"] = json!(k);
                }
                if let Some(c) = caching {
                    s["cachingMode"] = json!(c);
                }
                if let Some(fs) = fs {
                    s["fsType"] = json!(fs);
                }
                ("azureDisk".to_owned(), s)
            })
            .boxed(),
        (
            prop_oneof![
                adversarial().prop_map(|a| format!("azure-storage-account-{a}-secret")),
                adversarial()
            ],
            adversarial(),
            opt_string(),
            any::<bool>()
        )
            .prop_map(|(secret, share, ns, ro)| {
                let mut s = json!({"secretName": secret, "shareName": share, "readOnly": ro});
                if let Some(ns) = ns {
                    s["secretNamespace"] = json!(ns);
                }
                ("azureFile".to_owned(), s)
            })
            .boxed(),
        (adversarial(), opt_string(), opt_string())
            .prop_map(|(path, policy, fs)| {
                let mut s = json!({"volumePath": path});
                if let Some(p) = policy {
                    s["storagePolicyName"] = json!(p);
                }
                if let Some(fs) = fs {
                    s["fsType"] = json!(fs);
                }
                ("vsphereVolume".to_owned(), s)
            })
            .boxed(),
        (adversarial(), opt_string(), any::<bool>())
            .prop_map(|(id, fs, ro)| {
                let mut s = json!({"volumeID": id, "readOnly": ro});
                if let Some(fs) = fs {
                    s["fsType"] = json!(fs);
                }
                ("portworxVolume".to_owned(), s)
            })
            .boxed(),
        Just((
            "csi".to_owned(),
            json!({"driver": "other.csi", "volumeHandle": "h"})
        ))
        .boxed(),
    ]
    .boxed()
}

fn pv_case() -> BoxedStrategy<Value> {
    (
        (
            source(),
            opt_string(),
            labels(),
            prop::option::of((opt_string(), opt_string(), opt_string())),
        ),
        (
            node_affinity(),
            access_modes(),
            prop::option::of(opt_string()),
        ),
    )
        .prop_map(
            |((source, name, labels, annotations), (affinity, modes, claim_namespace))| {
                let mut metadata = json!({"labels": labels});
                if let Some(name) = name {
                    metadata["name"] = json!(name);
                }
                if let Some((rg, px_name, px_ns)) = annotations {
                    let mut a = Map::new();
                    for (k, v) in [
                        ("kubernetes.io/azure-file-resource-group", rg),
                        ("openstorage.io/auth-secret-name", px_name),
                        ("openstorage.io/auth-secret-namespace", px_ns),
                    ] {
                        if let Some(v) = v {
                            a.insert(k.to_owned(), json!(v));
                        }
                    }
                    metadata["annotations"] = Value::Object(a);
                }
                let mut spec = Map::new();
                spec.insert(source.0, source.1);
                if let Some(affinity) = affinity {
                    spec.insert("nodeAffinity".to_owned(), affinity);
                }
                if let Some(modes) = modes {
                    spec.insert("accessModes".to_owned(), json!(modes));
                }
                if let Some(ns) = claim_namespace {
                    let mut claim = json!({"name": "claim"});
                    if let Some(ns) = ns {
                        claim["namespace"] = json!(ns);
                    }
                    spec.insert("claimRef".to_owned(), claim);
                }
                json!({"pv": {"metadata": metadata, "spec": spec}})
            },
        )
        .boxed()
}

fn handle_part() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "projects",
            "UNSPECIFIED",
            "p1",
            "zones",
            "regions",
            "disks",
            "instances",
            "us-central1-a",
            "a-b",
            "a-b-c-d",
            "",
            "x",
        ])
        .prop_map(str::to_owned),
        adversarial(),
    ]
}

fn repair_case() -> impl Strategy<Value = Value> {
    (
        prop_oneof![
            4 => Just("pd.csi.storage.gke.io".to_owned()),
            1 => prop::sample::select(migration::MIGRATION_DRIVERS.to_vec()).prop_map(str::to_owned),
            1 => adversarial(),
        ],
        prop::collection::vec(handle_part(), 0..9),
        prop::collection::vec(handle_part(), 0..9),
    )
        .prop_map(|(driver, handle, node)| {
            json!({"repair": {"driver": driver, "handle": handle.join("/"), "nodeID": node.join("/")}})
        })
}

fn same_as_go(input: &Value) -> Result<(), TestCaseError> {
    let theirs = translator()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .ask(input);
    let theirs = canonical(theirs).expect("csi-translate's PV");
    let ours = canonical(rust_output(input).expect("generated PV")).expect("our PV");
    prop_assert_eq!(ours, theirs, "input: {}", input);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(support::proptest_cases(256)))]

    #[test]
    fn translated_pvs_match_csi_translation_lib(input in pv_case()) {
        same_as_go(&input)?;
    }

    #[test]
    fn repaired_handles_match_csi_translation_lib(input in repair_case()) {
        same_as_go(&input)?;
    }
}
