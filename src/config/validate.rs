//! The checks after parsing, in upstream's order: component-base's logging validation,
//! the feature gates, then upstream's remaining checks and ours (the table is in
//! `docs/bounds.md`).

use super::{Config, FeatureGates};
use crate::gofmt::parse as go;

/// A flag combination refused after parsing (exit 1, not 2).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Option -worker-threads must be greater than zero")]
    NoWorkers,
    #[error("only one of `--metrics-address` and `--http-endpoint` can be set")]
    TwoHttpAddresses,
    /// A metrics path no request can have (upstream's HTTP mux panics on it).
    #[error("--metrics-path must start with \"/\", got {0:?}")]
    MetricsPath(String),
    #[error("failed to store flag gates: {0}")]
    FeatureGates(String),
    /// What component-base's logging validation refuses (flush period, format, alpha options).
    #[error("LoggingConfiguration is invalid: {0}")]
    Logging(String),
    /// A negative duration where upstream would break (`docs/bounds.md`).
    #[error("invalid --{0}={1}: the duration must not be negative")]
    NegativeDuration(String, String),
    /// Leader-election timing client-go refuses (upstream panics on it).
    #[error("invalid leader election settings: {0}")]
    LeaderElection(&'static str),
    /// A negative burst with a rate limit: client-go fails every request.
    #[error(
        "invalid --kube-api-burst={0}: must not be negative while --kube-api-qps limits the rate"
    )]
    NegativeBurst(i64),
}

impl Config {
    /// component-base's logging validation, which upstream runs first (exit 1).
    pub fn validate_logging(&self) -> Result<(), Error> {
        let mut errors = Vec::new();
        let negative_flush = self
            .negative_durations
            .iter()
            .find(|(flag, _)| *flag == "log-flush-frequency");
        if let Some((_, value)) = negative_flush {
            errors.push(format!(
                "flushFrequency: Invalid value: {}: Must be greater than zero",
                go::quote(value)
            ));
        } else if self.log_flush_frequency.is_zero() {
            errors.push("flushFrequency: Invalid value: \"0s\": Must be greater than zero".into());
        }
        let format = self.logging_format.as_str();
        if !matches!(format, "text" | "json") {
            errors.push(format!(
                "format: Invalid value: {}: Unsupported log format",
                go::quote(format)
            ));
        }
        if !self.vmodule.is_empty() && !format.is_empty() && format != "text" {
            errors.push("vmodule: Forbidden: Only supported for text log format".into());
        }
        let alpha = "Forbidden: Feature LoggingAlphaOptions is disabled";
        let (text, json) = (
            &self.log_text_info_buffer_size,
            &self.log_json_info_buffer_size,
        );
        let nonzero = |size: &str| !go::quantity_is_zero(size).unwrap_or(true);
        for (on, field) in [
            (self.log_text_split_stream, "options.text.splitStream"),
            (nonzero(text), "options.text.infoBufferSize"),
            (self.log_json_split_stream, "options.json.splitStream"),
            (nonzero(json), "options.json.infoBufferSize"),
        ] {
            if on {
                errors.push(format!("{field}: {alpha}"));
            }
        }
        match errors.as_slice() {
            [] => Ok(()),
            [one] => Err(Error::Logging(one.clone())),
            many => Err(Error::Logging(format!("[{}]", many.join(", ")))),
        }
    }

    /// The feature gates, as upstream's `SetFromMap` resolves the merged map (exit 1 on error).
    pub fn feature_gates(&self) -> Result<FeatureGates, Error> {
        FeatureGates::resolve(&self.feature_gates).map_err(Error::FeatureGates)
    }

    /// Checks what parsing cannot, after `--version` (exit 1).
    pub fn validate(&self) -> Result<(), Error> {
        if !self.http_endpoint.is_empty() && !self.metrics_address.is_empty() {
            return Err(Error::TwoHttpAddresses);
        }
        let serving = !self.http_endpoint.is_empty() || !self.metrics_address.is_empty();
        if serving && !self.metrics_path.starts_with('/') {
            return Err(Error::MetricsPath(self.metrics_path.clone()));
        }
        if self.worker_threads == 0 {
            return Err(Error::NoWorkers);
        }
        let leader_only = |flag: &str| flag.starts_with("leader-election-");
        for (flag, value) in &self.negative_durations {
            if *flag == "log-flush-frequency" || (leader_only(flag) && !self.leader_election) {
                continue;
            }
            return Err(Error::NegativeDuration(flag.clone(), value.clone()));
        }
        // client-go: a zero QPS means 5, so any QPS but a negative one (or NaN) limits.
        if self.kube_api_burst < 0 && self.kube_api_qps >= 0.0 {
            return Err(Error::NegativeBurst(self.kube_api_burst));
        }
        if self.leader_election {
            // client-go's `NewLeaderElector` checks.
            crate::leader::validate_timing(
                self.leader_election_lease_duration,
                self.leader_election_renew_deadline,
                self.leader_election_retry_period,
            )
            .map_err(|invalid| Error::LeaderElection(invalid.0))?;
        }
        for a in &self.adjusted {
            tracing::warn!(
                flag = a.flag,
                given = %a.given,
                used = %a.used,
                reason = a.reason,
                "Flag value out of range; using the nearest sane value"
            );
        }
        if self.retry_interval_max < self.retry_interval_start {
            tracing::warn!(
                retry_interval_start = ?self.retry_interval_start,
                retry_interval_max = ?self.retry_interval_max,
                "--retry-interval-max is below --retry-interval-start: every retry waits --retry-interval-max (as upstream)"
            );
        }
        Ok(())
    }
}
