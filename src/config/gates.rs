//! `--feature-gates`: every name upstream accepts, read as upstream reads them
//! (component-base's `MapStringBool`, [`parse_pairs`], exit 2; then the
//! apiserver gate's `SetFromMap`, [`FeatureGates::resolve`], exit 1), and the
//! two that act here. The table: `docs/contract.md#feature-gates`.

use std::collections::BTreeMap;

use crate::gofmt::parse as go;

/// The maturity a gate has at upstream's emulated version (1.36): `AllAlpha` and
/// `AllBeta` set the alpha and beta gates not set by name; setting a GA or a
/// deprecated gate logs upstream's warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Alpha,
    Beta,
    Ga,
    Deprecated,
}

use Stage::{Alpha, Beta, Deprecated, Ga};

/// Every gate upstream v4.12.0's `--feature-gates` accepts: stage, default, whether it is
/// locked to its default, and the names of the gates that share them.
///
/// Source: the gates registered on `k8s.io/apiserver/pkg/util/feature.DefaultMutableFeatureGate`
/// in a program importing what `cmd/csi-attacher/main.go` of external-attacher v4.12.0 imports
/// (k8s.io/apiserver and component-base v0.36.3, identical to v0.36.1 there; csi-lib-utils
/// v0.24.0), read at the emulated version 1.36 with minimum compatibility 1.35. No gate is
/// pre-alpha at 1.36 and none declares dependencies.
#[rustfmt::skip]
pub const KNOWN: &[(Stage, bool, bool, &str)] = &[
    (Alpha, false, false, "APIServingWithRoutine AllAlpha AllowUnsafeMalformedObjectDeletion \
        CBORServingAndStorage ManifestBasedAdmissionControlConfig NativeHistograms \
        ReleaseLeaderElectionOnExit ShardedListAndWatch StorageVersionAPI"),
    (Beta, false, false, "AllBeta ConcurrentWatchObjectDecode CoordinatedLeaderElection"),
    (Beta, true, false, "APIResponseCompression APIServerIdentity \
        AllowParsingUserUIDFromCertAuth ComponentFlagz ComponentStatusz \
        ConstrainedImpersonation DeclarativeValidationBeta DetectCacheInconsistency \
        ListFromCacheSnapshot OpenAPIEnums RemoteRequestHeaderUID SizeBasedListCostEstimate \
        StorageVersionHash StructuredAuthenticationConfigurationEgressSelector \
        StructuredAuthenticationConfigurationJWKSMetrics \
        TokenRequestServiceAccountUIDValidation UnauthenticatedHTTP2DOSMitigation \
        UnknownVersionInteroperabilityProxy WatchCacheInitializationPostStartHook WatchList"),
    (Ga, true, false, "MutableCSINodeAllocatableCount MutatingAdmissionPolicy"),
    (Ga, true, true, "APIServerTracing AnonymousAuthConfigurableEndpoints \
        AuthorizeWithSelectors BtreeWatchCache ConsistentListFromCache DeclarativeValidation \
        ResilientWatchCacheInitialization RetryGenerateName StreamingCollectionEncodingToJSON \
        StreamingCollectionEncodingToProtobuf StructuredAuthenticationConfiguration"),
    (Deprecated, false, false, "DeclarativeValidationTakeover KMSv1"),
    (Deprecated, false, true, "SeparateCacheWatchRPC"),
    (Deprecated, true, true, "AggregatedDiscoveryRemoveBetaType"),
];

const RELEASE_LEADER_ELECTION_ON_EXIT: &str = "ReleaseLeaderElectionOnExit";
const MUTABLE_CSI_NODE_ALLOCATABLE_COUNT: &str = "MutableCSINodeAllocatableCount";
const ALL_ALPHA: &str = "AllAlpha";

/// Every gate in [`KNOWN`]: its exact, case-sensitive name, stage, default, lock.
pub fn all() -> impl Iterator<Item = (&'static str, Stage, bool, bool)> {
    KNOWN.iter().flat_map(|&(stage, default, locked, names)| {
        names
            .split_whitespace()
            .map(move |name| (name, stage, default, locked))
    })
}

/// Stage, default and lock of the gate called `name`, if upstream knows it.
pub fn lookup(name: &str) -> Option<(Stage, bool, bool)> {
    all()
        .find(|gate| gate.0 == name)
        .map(|(_, s, d, l)| (s, d, l))
}

/// One `--feature-gates` value, as `MapStringBool.Set` reads it: `key=bool` pairs split on
/// commas, empty items skipped, key and value trimmed, any key accepted (checked later).
pub fn parse_pairs(value: &str) -> Result<BTreeMap<String, bool>, String> {
    let mut pairs = BTreeMap::new();
    for item in value.split(',').filter(|item| !item.is_empty()) {
        let Some((key, raw)) = item.split_once('=') else {
            return Err("malformed pair, expect string=bool".to_string());
        };
        let (key, raw) = (key.trim(), raw.trim());
        let value = go::parse_bool(raw).ok_or_else(|| {
            format!(
                "invalid value of {key}: {raw}, err: strconv.ParseBool: parsing {}: invalid syntax",
                go::quote(raw)
            )
        })?;
        pairs.insert(key.to_string(), value);
    }
    Ok(pairs)
}

/// The gates that change what the attacher does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeatureGates {
    /// Release the Lease on SIGTERM/SIGINT (ours: on by default; upstream: alpha, off).
    pub release_leader_election_on_exit: bool,
    /// Put `errorCode` on attach errors (GA in upstream v4.12, on).
    pub mutable_csi_node_allocatable_count: bool,
}

impl FeatureGates {
    /// Applies the merged `--feature-gates` map as upstream's `SetFromMap` does.
    ///
    /// Errors carry upstream's text: `unrecognized feature gate: X` (the first unknown
    /// name in sorted order; upstream picks one at random from its map), else every lock
    /// violation, one as is and several as `[a, b]`.
    pub fn resolve(set: &BTreeMap<String, bool>) -> Result<Self, String> {
        if let Some(unknown) = set.keys().find(|name| lookup(name).is_none()) {
            return Err(format!("unrecognized feature gate: {unknown}"));
        }
        let locked: Vec<String> = set
            .iter()
            .filter_map(|(name, value)| {
                let (_, default, locked) = lookup(name)?;
                (locked && default != *value).then(|| {
                    format!(
                        "cannot set feature gate {name} to {value}, feature is locked to {default}"
                    )
                })
            })
            .collect();
        match locked.as_slice() {
            [] => {}
            [one] => return Err(one.clone()),
            many => return Err(format!("[{}]", many.join(", "))),
        }
        let get = |name| set.get(name).copied();
        Ok(Self {
            // Named beats AllAlpha, which beats our default (on where upstream's is off).
            release_leader_election_on_exit: get(RELEASE_LEADER_ELECTION_ON_EXIT)
                .or(get(ALL_ALPHA))
                .unwrap_or(true),
            mutable_csi_node_allocatable_count: get(MUTABLE_CSI_NODE_ALLOCATABLE_COUNT)
                .unwrap_or(true),
        })
    }
}

/// The names in `set` that change nothing here (every gate but the attacher's two, and
/// `AllAlpha` unless it decides `ReleaseLeaderElectionOnExit`).
pub fn without_effect(set: &BTreeMap<String, bool>) -> Vec<&str> {
    let named_release = set.contains_key(RELEASE_LEADER_ELECTION_ON_EXIT);
    set.keys()
        .map(String::as_str)
        .filter(|name| match *name {
            RELEASE_LEADER_ELECTION_ON_EXIT | MUTABLE_CSI_NODE_ALLOCATABLE_COUNT => false,
            ALL_ALPHA => named_release,
            _ => true,
        })
        .collect()
}

impl super::Config {
    /// Logs, once, what upstream logs when gates are set (GA and deprecated warnings) and
    /// which of them do nothing here.
    pub fn log_feature_gates(&self) {
        let set = &self.feature_gates;
        for (name, value) in set {
            let stage = match lookup(name).map(|gate| gate.0) {
                Some(Ga) => "GA",
                Some(Deprecated) => "deprecated",
                _ => continue,
            };
            tracing::info!(feature_gate = %name, value,
                "Warning: setting {stage} feature gate. It will be removed in a future release.");
        }
        let idle = without_effect(set);
        if !idle.is_empty() {
            tracing::info!(
                feature_gates = ?idle,
                "Feature gates accepted for compatibility with the Go external-attacher have no effect here"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(pairs: &[(&str, bool)]) -> BTreeMap<String, bool> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn the_table_has_49_names_and_the_attacher_gates() {
        let mut names: Vec<&str> = all().map(|g| g.0).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), 49, "49 names, each once");
        assert_eq!(
            lookup("ReleaseLeaderElectionOnExit"),
            Some((Alpha, false, false))
        );
        assert_eq!(
            lookup("MutableCSINodeAllocatableCount"),
            Some((Ga, true, false))
        );
        assert!(lookup("AllAlpha").is_some() && lookup("AllBeta").is_some());
        assert!(lookup("allalpha").is_none(), "names are case-sensitive");
        // Not registered on the apiserver's gate: client-go and logging gates.
        for absent in [
            "WatchListClient",
            "LoggingAlphaOptions",
            "ContextualLogging",
        ] {
            assert!(lookup(absent).is_none(), "{absent}");
        }
    }

    #[test]
    fn pairs_parse_like_map_string_bool() {
        assert_eq!(
            parse_pairs(" A = true ,,B=0,").as_ref().map(|m| m.len()),
            Ok(2)
        );
        assert_eq!(parse_pairs("A=true,A=false"), Ok(set(&[("A", false)])));
        assert_eq!(parse_pairs(""), Ok(BTreeMap::new()));
        // An empty key parses; SetFromMap rejects it later.
        assert_eq!(parse_pairs("=true"), Ok(set(&[("", true)])));
        assert_eq!(
            parse_pairs("Foo").unwrap_err(),
            "malformed pair, expect string=bool"
        );
        assert_eq!(
            parse_pairs("Foo=maybe").unwrap_err(),
            "invalid value of Foo: maybe, err: strconv.ParseBool: parsing \"maybe\": invalid syntax"
        );
        assert!(parse_pairs("A=true,Foo").is_err());
        assert!(parse_pairs("A=yes").is_err());
        assert_eq!(parse_pairs("A=T"), Ok(set(&[("A", true)])));
    }

    #[test]
    fn every_known_gate_is_accepted_unless_set_against_its_lock() {
        for (name, _, default, locked) in all() {
            for value in [true, false] {
                let result = FeatureGates::resolve(&set(&[(name, value)]));
                let refused = locked && value != default;
                assert_eq!(result.is_err(), refused, "{name}={value}");
            }
        }
        assert_eq!(
            FeatureGates::resolve(&set(&[("APIServerTracing", false)])).unwrap_err(),
            "cannot set feature gate APIServerTracing to false, feature is locked to true"
        );
        assert_eq!(
            FeatureGates::resolve(&set(&[
                ("APIServerTracing", false),
                ("SeparateCacheWatchRPC", true)
            ]))
            .unwrap_err(),
            "[cannot set feature gate APIServerTracing to false, feature is locked to true, \
             cannot set feature gate SeparateCacheWatchRPC to true, feature is locked to false]"
        );
    }

    #[test]
    fn unknown_names_are_refused_first() {
        assert_eq!(
            FeatureGates::resolve(&set(&[("NoSuch", true)])).unwrap_err(),
            "unrecognized feature gate: NoSuch"
        );
        assert_eq!(
            FeatureGates::resolve(&set(&[("", true)])).unwrap_err(),
            "unrecognized feature gate: "
        );
        assert_eq!(
            FeatureGates::resolve(&set(&[("APIServerTracing", false), ("Zed", true)])).unwrap_err(),
            "unrecognized feature gate: Zed"
        );
    }

    #[test]
    fn all_alpha_reaches_release_on_exit_only_when_it_is_not_named() {
        let resolve = |pairs: &[(&str, bool)]| FeatureGates::resolve(&set(pairs)).expect("valid");
        assert!(resolve(&[]).release_leader_election_on_exit, "our default");
        assert!(!resolve(&[("AllAlpha", false)]).release_leader_election_on_exit);
        assert!(resolve(&[("AllAlpha", true)]).release_leader_election_on_exit);
        assert!(
            resolve(&[("AllAlpha", false), ("ReleaseLeaderElectionOnExit", true)])
                .release_leader_election_on_exit
        );
        assert!(
            !resolve(&[("AllAlpha", true), ("ReleaseLeaderElectionOnExit", false)])
                .release_leader_election_on_exit
        );
        // GA: AllAlpha/AllBeta leave it alone; it may still be switched off by name.
        assert!(
            resolve(&[("AllAlpha", false), ("AllBeta", false)]).mutable_csi_node_allocatable_count
        );
        assert!(
            !resolve(&[("MutableCSINodeAllocatableCount", false)])
                .mutable_csi_node_allocatable_count
        );
    }

    #[test]
    fn gates_without_effect_are_named() {
        assert_eq!(
            without_effect(&set(&[
                ("AllAlpha", true),
                ("AllBeta", true),
                ("KMSv1", true),
                ("MutableCSINodeAllocatableCount", true)
            ])),
            vec!["AllBeta", "KMSv1"]
        );
        assert_eq!(
            without_effect(&set(&[
                ("AllAlpha", true),
                ("ReleaseLeaderElectionOnExit", false)
            ])),
            vec!["AllAlpha"]
        );
    }
}
