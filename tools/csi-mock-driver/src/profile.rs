//! Driver profiles: how a real cloud controller plugin behaves under load,
//! as data (TOML). `--profile NAME` picks a built-in one (the files under
//! `profiles/`, compiled in), `--profile-file PATH` reads a user's own.
//!
//! The schema is documented field by field in `docs/driver-profiles.md`,
//! which also gives every built-in value's public source. The simulation of
//! a profile is `cloud.rs`.

use std::time::Duration;

use serde::Deserialize;
use tonic::Code;

/// The built-in profiles: name and TOML text.
pub const BUILTIN: [(&str, &str); 5] = [
    ("aws-ebs", include_str!("profiles/aws-ebs.toml")),
    ("azure-disk", include_str!("profiles/azure-disk.toml")),
    (
        "azure-disk-fast",
        include_str!("profiles/azure-disk-fast.toml"),
    ),
    ("gce-pd", include_str!("profiles/gce-pd.toml")),
    (
        "serial-per-node",
        include_str!("profiles/serial-per-node.toml"),
    ),
];

/// Why a profile cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("unknown profile {name:?}; built-in profiles: {known}")]
    Unknown { name: String, known: String },
    #[error("cannot read profile file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("profile {origin}: {message}")]
    Invalid { origin: String, message: String },
}

/// One profile, as the TOML file says it.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub name: String,
    #[serde(default)]
    pub summary: String,
    /// The CSI capabilities the real driver advertises by default (names as
    /// `--capabilities` takes them); empty: the mock's default list.
    #[serde(default)]
    pub capabilities: Vec<String>,
    pub attach: Operation,
    pub detach: Operation,
    /// The cloud API's token bucket for mutating calls; none: no limit.
    #[serde(default)]
    pub api: Option<Api>,
    #[serde(default)]
    pub node: Node,
    /// Per-node batching; none: every call is its own cloud operation.
    #[serde(default)]
    pub batch: Option<Batch>,
    #[serde(default)]
    pub operation: Around,
    /// Per (node, volume) backoff after an error; none: no backoff.
    #[serde(default)]
    pub backoff: Option<Backoff>,
}

/// One kind of cloud operation (attach or detach).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Operation {
    pub latency: Latency,
}

/// How long one cloud operation takes, sampled per operation.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum Latency {
    Fixed {
        ms: u64,
    },
    Uniform {
        min_ms: u64,
        max_ms: u64,
    },
    /// Log-normal with this median and 99th percentile, optionally capped.
    Lognormal {
        median_ms: u64,
        p99_ms: u64,
        #[serde(default)]
        max_ms: Option<u64>,
    },
}

/// z of the standard normal's 99th percentile.
const Z99: f64 = 2.326_347_874_040_841;

impl Latency {
    /// One duration from two independent uniforms in [0, 1).
    pub fn sample(&self, u1: f64, u2: f64) -> Duration {
        let ms = match *self {
            Latency::Fixed { ms } => ms as f64,
            Latency::Uniform { min_ms, max_ms } => {
                min_ms as f64 + (max_ms.saturating_sub(min_ms)) as f64 * u1
            }
            Latency::Lognormal {
                median_ms,
                p99_ms,
                max_ms,
            } => {
                let mu = (median_ms.max(1) as f64).ln();
                let sigma = ((p99_ms.max(median_ms).max(1) as f64).ln() - mu) / Z99;
                // Box-Muller; 1 - u1 keeps the logarithm's argument in (0, 1].
                let z = (-2.0 * (1.0 - u1).ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
                let ms = (mu + sigma * z).exp();
                max_ms.map_or(ms, |cap| ms.min(cap as f64))
            }
        };
        Duration::from_secs_f64(ms.max(0.0) / 1e3)
    }

    fn validate(&self) -> Result<(), String> {
        match *self {
            Latency::Uniform { min_ms, max_ms } if max_ms < min_ms => Err(format!(
                "uniform latency: max_ms {max_ms} < min_ms {min_ms}"
            )),
            Latency::Lognormal {
                median_ms, p99_ms, ..
            } if p99_ms < median_ms => Err(format!(
                "lognormal latency: p99_ms {p99_ms} < median_ms {median_ms}"
            )),
            _ => Ok(()),
        }
    }
}

/// What a throttled call does.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum OnThrottle {
    /// Retried inside the call with backoff (an SDK's retryer): the call gets slower.
    #[default]
    Retry,
    /// The call fails at once.
    Fail,
}

/// A token bucket shared by every mutating cloud call.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Api {
    pub bucket: u32,
    pub refill_per_s: f64,
    /// A bucket per API, attach's and detach's (each `bucket` and
    /// `refill_per_s`); `false`: one bucket for both.
    #[serde(default)]
    pub per_kind: bool,
    #[serde(default)]
    pub on_throttle: OnThrottle,
    #[serde(default)]
    pub retry_max_attempts: u32,
    #[serde(default)]
    pub retry_base_ms: u64,
    #[serde(default)]
    pub retry_max_backoff_ms: u64,
    /// An Unpublish of a volume not attached to the node still sends the
    /// detach request (a token; waited for or failed as `on_throttle` says).
    #[serde(default)]
    pub detach_unattached_takes_token: bool,
    #[serde(default = "internal")]
    pub throttle_code: GrpcCode,
    #[serde(default)]
    pub throttle_message: String,
}

/// What a call that finds its node's operation slots full does.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum OnBusy {
    /// Block until a slot frees (or the caller gives up).
    #[default]
    Wait,
    /// Answer at once with the busy code.
    Fail,
}

/// How a node (cloud instance, VM) limits attachments and operations.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Node {
    /// Volumes attached or attaching on one node; 0: no limit.
    #[serde(default)]
    pub max_attachments: usize,
    #[serde(default = "resource_exhausted")]
    pub max_attachments_code: GrpcCode,
    #[serde(default)]
    pub max_attachments_message: String,
    /// Cloud operations running on one node at once; 0: unlimited.
    #[serde(default)]
    pub max_operations: usize,
    #[serde(default)]
    pub on_busy: OnBusy,
    /// Who holds a node slot: the cloud operation (a queue in the cloud) or
    /// the driver's call (a lock in the driver, released when its caller goes away).
    #[serde(default)]
    pub slot_scope: SlotScope,
    /// The cloud runs one operation per node at a time, attaches and
    /// detaches alike: an operation waits for the node's previous one to
    /// end, also one whose caller gave up (whatever the driver's slots).
    #[serde(default)]
    pub cloud_serial: bool,
    /// A freed slot goes to a waiting detach before any waiting attach
    /// (default: first come, first served).
    #[serde(default)]
    pub detach_first: bool,
    #[serde(default = "internal")]
    pub busy_code: GrpcCode,
    #[serde(default)]
    pub busy_message: String,
    /// A Publish to a node the cloud no longer has.
    #[serde(default = "not_found")]
    pub gone_publish_code: GrpcCode,
    #[serde(default)]
    pub gone_publish_message: String,
    /// An Unpublish from a node the cloud no longer has: `ok` or a code.
    #[serde(default = "gone_ok")]
    pub gone_unpublish: GoneUnpublish,
    #[serde(default)]
    pub gone_unpublish_message: String,
}

impl Default for Node {
    fn default() -> Self {
        Self {
            max_attachments: 0,
            max_attachments_code: resource_exhausted(),
            max_attachments_message: String::new(),
            max_operations: 0,
            on_busy: OnBusy::Wait,
            slot_scope: SlotScope::Operation,
            cloud_serial: false,
            detach_first: false,
            busy_code: internal(),
            busy_message: String::new(),
            gone_publish_code: not_found(),
            gone_publish_message: String::new(),
            gone_unpublish: gone_ok(),
            gone_unpublish_message: String::new(),
        }
    }
}

/// Who holds one of a node's operation slots.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum SlotScope {
    /// The cloud operation, until it completes (outliving its caller if it does).
    #[default]
    Operation,
    /// The driver's call, from before its checks until it answers or its
    /// caller goes away.
    Call,
}

/// `ok`, or the code an Unpublish from a deleted node fails with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GoneUnpublish {
    Ok,
    Fail(Code),
}

impl<'de> Deserialize<'de> for GoneUnpublish {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        if text.eq_ignore_ascii_case("ok") {
            return Ok(GoneUnpublish::Ok);
        }
        parse_code(&text)
            .map(GoneUnpublish::Fail)
            .map_err(serde::de::Error::custom)
    }
}

/// Per-node batching: the first queued request waits `initial_delay_ms`,
/// then one node update carries up to `max_batch` queued requests.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Batch {
    pub initial_delay_ms: u64,
    pub max_batch: usize,
    #[serde(default)]
    pub detach_first: bool,
}

/// What a pending cloud operation means to a new call for it.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Pending {
    /// Fail with the pending code.
    #[default]
    Fail,
    /// Wait for it and answer with its outcome.
    Wait,
}

/// Around one operation: what outlives the caller, duplicates, pending work.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Around {
    /// The cloud operation goes on after the caller's deadline or cancel.
    #[serde(default)]
    pub outlives_caller: bool,
    /// A second call for a (volume, node) the driver is still serving; none
    /// (or empty): no check.
    #[serde(default, deserialize_with = "optional_code")]
    pub duplicate_code: Option<GrpcCode>,
    #[serde(default)]
    pub duplicate_message: String,
    #[serde(default)]
    pub pending: Pending,
    #[serde(default = "internal")]
    pub pending_code: GrpcCode,
    #[serde(default)]
    pub pending_message: String,
    /// The driver learns that the cloud operation is done only when it polls:
    /// at 0, then after `poll_initial_ms`, each wait `poll_factor` times the
    /// last. 0: the driver answers as soon as the operation completes.
    #[serde(default)]
    pub poll_initial_ms: u64,
    #[serde(default = "one")]
    pub poll_factor: f64,
    /// Each poll reads the state up to this long (uniform) after it is due
    /// (a batcher of the driver's Describe calls); the next wait starts
    /// after it. 0: at once.
    #[serde(default)]
    pub poll_delay_max_ms: u64,
    /// A call for a volume with an operation running on another node; none
    /// (or empty): no check.
    #[serde(default, deserialize_with = "optional_code")]
    pub volume_busy_code: Option<GrpcCode>,
    #[serde(default)]
    pub volume_busy_message: String,
}

impl Default for Around {
    fn default() -> Self {
        Self {
            outlives_caller: false,
            duplicate_code: None,
            duplicate_message: String::new(),
            pending: Pending::Fail,
            pending_code: internal(),
            pending_message: String::new(),
            poll_initial_ms: 0,
            poll_factor: 1.0,
            poll_delay_max_ms: 0,
            volume_busy_code: None,
            volume_busy_message: String::new(),
        }
    }
}

/// After an error, calls for that (node, volume) fail at once for a while.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Backoff {
    pub initial_ms: u64,
    pub max_ms: u64,
    #[serde(default)]
    pub message: String,
}

/// A gRPC code written by its Go name (`ResourceExhausted`), as the CSI spec's tables do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrpcCode(pub Code);

impl<'de> Deserialize<'de> for GrpcCode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        parse_code(&text)
            .map(GrpcCode)
            .map_err(serde::de::Error::custom)
    }
}

/// An optional code: absent or `""` is none.
fn optional_code<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<GrpcCode>, D::Error> {
    let text = String::deserialize(d)?;
    if text.trim().is_empty() {
        return Ok(None);
    }
    parse_code(&text)
        .map(|c| Some(GrpcCode(c)))
        .map_err(serde::de::Error::custom)
}

fn parse_code(text: &str) -> Result<Code, String> {
    let code = (0..=16)
        .map(Code::from_i32)
        .find(|c| csi_attacher::csi::go_code_name(*c).eq_ignore_ascii_case(text.trim()));
    match code {
        Some(Code::Ok) | None => Err(format!(
            "{text:?} is not an error code (use a Go name such as Internal or ResourceExhausted)"
        )),
        Some(code) => Ok(code),
    }
}

fn one() -> f64 {
    1.0
}
fn internal() -> GrpcCode {
    GrpcCode(Code::Internal)
}
fn resource_exhausted() -> GrpcCode {
    GrpcCode(Code::ResourceExhausted)
}
fn not_found() -> GrpcCode {
    GrpcCode(Code::NotFound)
}
fn gone_ok() -> GoneUnpublish {
    GoneUnpublish::Ok
}

impl Profile {
    /// A built-in profile by name.
    pub fn builtin(name: &str) -> Result<Self, ProfileError> {
        let (_, text) =
            BUILTIN
                .iter()
                .find(|(n, _)| *n == name)
                .ok_or_else(|| ProfileError::Unknown {
                    name: name.to_string(),
                    known: BUILTIN.map(|(n, _)| n).join(", "),
                })?;
        Self::parse(text, name)
    }

    /// A profile from a TOML file.
    pub fn from_file(path: &std::path::Path) -> Result<Self, ProfileError> {
        let text = std::fs::read_to_string(path).map_err(|source| ProfileError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses and checks a profile; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ProfileError> {
        let invalid = |message: String| ProfileError::Invalid {
            origin: origin.to_string(),
            message,
        };
        let profile: Profile = toml::from_str(text).map_err(|e| invalid(e.to_string()))?;
        profile.validate().map_err(invalid)?;
        Ok(profile)
    }

    fn validate(&self) -> Result<(), String> {
        crate::parse_capabilities(&self.capabilities.join(","))
            .map_err(|e| format!("capabilities: {e}"))?;
        self.attach.latency.validate()?;
        self.detach.latency.validate()?;
        if let Some(api) = &self.api {
            if api.bucket == 0 {
                return Err("api.bucket must be at least 1".into());
            }
            if !(api.refill_per_s.is_finite() && api.refill_per_s > 0.0) {
                return Err(format!(
                    "api.refill_per_s must be a positive number, got {}",
                    api.refill_per_s
                ));
            }
        }
        let around = &self.operation;
        if !(around.poll_factor.is_finite() && around.poll_factor >= 1.0) {
            return Err(format!(
                "operation.poll_factor must be a number ≥ 1, got {}",
                around.poll_factor
            ));
        }
        if let Some(batch) = &self.batch {
            if batch.max_batch == 0 {
                return Err("batch.max_batch must be at least 1".into());
            }
        }
        if let Some(backoff) = &self.backoff {
            if backoff.initial_ms == 0 || backoff.max_ms < backoff.initial_ms {
                return Err(format!(
                    "backoff: initial_ms must be > 0 and ≤ max_ms (got {} and {})",
                    backoff.initial_ms, backoff.max_ms
                ));
            }
        }
        Ok(())
    }
}

impl Around {
    /// When the driver sees an operation that took `took` (since its polls
    /// started) done: its first poll that reads the state at or after it,
    /// the polls' waits multiplied by `scale` (the driver's `--time-scale`,
    /// as every other duration of the profile), each poll reading the state
    /// `delay()` after it is due (already scaled).
    pub fn seen_after(
        &self,
        took: Duration,
        scale: f64,
        mut delay: impl FnMut() -> Duration,
    ) -> Duration {
        if self.poll_initial_ms == 0 {
            return took;
        }
        let mut at = delay();
        let mut wait = self.poll_initial_ms as f64 * scale / 1e3;
        while at < took {
            at += Duration::from_secs_f64(wait) + delay();
            wait *= self.poll_factor;
        }
        at
    }

    /// One poll's delay from `u` uniform in [0, 1), scaled.
    pub fn poll_delay(&self, u: f64, scale: f64) -> Duration {
        Duration::from_secs_f64(self.poll_delay_max_ms as f64 * scale / 1e3 * u)
    }
}

/// A message template with `{volume}` and `{node}` filled in.
pub fn fill(template: &str, volume: &str, node: &str) -> String {
    template.replace("{volume}", volume).replace("{node}", node)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_profile_parses_and_is_named_as_its_file() {
        for (name, _) in BUILTIN {
            let profile = Profile::builtin(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(profile.name, name);
        }
    }

    #[test]
    fn azure_disk_fast_is_azure_disk_with_a_6_s_median_and_nothing_else() {
        let base = Profile::builtin("azure-disk").expect("azure-disk");
        let mut fast = Profile::builtin("azure-disk-fast").expect("azure-disk-fast");
        let median = |latency: Latency| match latency {
            Latency::Lognormal { median_ms, .. } => median_ms,
            other => panic!("{other:?}"),
        };
        assert_eq!(median(fast.attach.latency), 6000);
        assert_eq!(median(fast.detach.latency), 6000);
        // With azure-disk's name, summary and medians it is azure-disk.
        fast.name = base.name.clone();
        fast.summary = base.summary.clone();
        fast.attach.latency = base.attach.latency;
        fast.detach.latency = base.detach.latency;
        assert_eq!(fast, base);
    }

    #[test]
    fn an_unknown_profile_names_the_built_in_ones() {
        let err = Profile::builtin("nfs").unwrap_err().to_string();
        assert!(
            err.contains("aws-ebs, azure-disk, azure-disk-fast, gce-pd, serial-per-node"),
            "{err}"
        );
    }

    #[test]
    fn unknown_fields_and_bad_codes_are_refused_with_the_origin() {
        let base = "name = \"x\"\n[attach.latency]\nkind = \"fixed\"\nms = 1\n[detach.latency]\nkind = \"fixed\"\nms = 1\n";
        assert!(Profile::parse(base, "t").is_ok());
        let err = Profile::parse(&format!("{base}[node]\nmax_attachment = 3\n"), "mine.toml")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("mine.toml") && err.contains("max_attachment"),
            "{err}"
        );
        let err = Profile::parse(
            &format!("{base}[node]\nbusy_code = \"Busy\"\n"),
            "mine.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("\"Busy\" is not an error code"), "{err}");
        let err = Profile::parse(&format!("{base}[node]\nbusy_code = \"OK\"\n"), "t")
            .unwrap_err()
            .to_string();
        assert!(err.contains("not an error code"), "{err}");
        let err = Profile::parse(
            &format!("{base}[backoff]\ninitial_ms = 10\nmax_ms = 5\n"),
            "t",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("backoff"), "{err}");
    }

    #[test]
    fn an_empty_code_is_no_check_and_polls_round_up_to_the_next_poll() {
        let base = "name = \"x\"\n[attach.latency]\nkind = \"fixed\"\nms = 1\n[detach.latency]\nkind = \"fixed\"\nms = 1\n";
        let p = Profile::parse(
            &format!("{base}[operation]\nduplicate_code = \"\"\nvolume_busy_code = \"Aborted\"\npoll_initial_ms = 1000\npoll_factor = 1.8\n"),
            "t",
        )
        .expect("profile");
        assert_eq!(p.operation.duplicate_code, None);
        assert_eq!(p.operation.volume_busy_code, Some(GrpcCode(Code::Aborted)));
        // Polls at 0, 1, 2.8, 6.04, 11.872, 22.3696 s.
        let secs = |s: f64| Duration::from_secs_f64(s);
        let seen = |took: f64| {
            p.operation
                .seen_after(secs(took), 1.0, || Duration::ZERO)
                .as_secs_f64()
        };
        assert!((seen(0.5) - 1.0).abs() < 1e-6);
        assert!((seen(2.0) - 2.8).abs() < 1e-6);
        assert!((seen(12.0) - 22.3696).abs() < 1e-6);
        let no_polls = Profile::parse(base, "t").expect("profile");
        assert_eq!(
            no_polls.operation.seen_after(secs(3.3), 1.0, || secs(1.0)),
            secs(3.3)
        );
        // Each poll reads the state its delay after it is due, and the next
        // wait starts then: 0.1, 1.2, 3.1 s for 0.1 s each.
        let delayed = p.operation.seen_after(secs(2.0), 1.0, || secs(0.1));
        assert!((delayed.as_secs_f64() - 3.1).abs() < 1e-6, "{delayed:?}");
        // Scaled as every other duration: polls at 0, 0.01, 0.028, … s.
        let scaled = p
            .operation
            .seen_after(secs(0.02), 0.01, || Duration::ZERO)
            .as_secs_f64();
        assert!((scaled - 0.028).abs() < 1e-9, "{scaled}");
    }

    #[test]
    fn lognormal_samples_have_the_median_and_p99_they_were_given() {
        let latency = Latency::Lognormal {
            median_ms: 2000,
            p99_ms: 10000,
            max_ms: None,
        };
        let mut rng = fastrand::Rng::with_seed(7);
        let mut samples: Vec<f64> = (0..20_000)
            .map(|_| latency.sample(rng.f64(), rng.f64()).as_secs_f64() * 1e3)
            .collect();
        samples.sort_by(f64::total_cmp);
        let median = samples[samples.len() / 2];
        let p99 = samples[samples.len() * 99 / 100];
        assert!((1900.0..2100.0).contains(&median), "median {median}");
        assert!((9000.0..11000.0).contains(&p99), "p99 {p99}");
        let capped = Latency::Lognormal {
            median_ms: 2000,
            p99_ms: 10000,
            max_ms: Some(3000),
        };
        assert!((0..1000).all(|_| capped.sample(rng.f64(), rng.f64()) <= Duration::from_secs(3)));
    }
}
