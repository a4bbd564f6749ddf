//! One flag's value, read the way Go's `flag` package (and klog, component-base,
//! csi-lib-utils) reads it: the value parsers of the flags in [`Config`](super::Config).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::gofmt::parse as go;

/// Duration flags: Go's `time.ParseDuration`. A negative value parses (as Go) and is kept
/// as zero here; [`Config::try_parse_go`](super::Config::try_parse_go) records it for validation.
pub(super) fn duration_flag(s: &str) -> Result<Duration, String> {
    go::parse_duration(s)
        .map(|nanos| Duration::from_nanos(u64::try_from(nanos).unwrap_or(0)))
        .map_err(|_| "parse error".to_string())
}

/// `flag.Int`, then Go's `int32(n)` (upstream's ListVolumes lister keeps the low 32 bits).
pub(super) fn int32_flag(s: &str) -> Result<i32, go::NumError> {
    go::parse_int(s).map(|n| n as i32)
}

/// `flag.Bool`.
pub(super) fn bool_flag(s: &str) -> Result<bool, String> {
    go::parse_bool(s).ok_or_else(|| "parse error".to_string())
}

/// csi-lib-utils' `--automaxprocs` (`flag.BoolFunc`): an empty value also means true.
pub(super) fn automaxprocs_flag(s: &str) -> Result<bool, String> {
    if s.is_empty() {
        return Ok(true);
    }
    go::parse_bool(s).ok_or_else(|| {
        format!(
            "strconv.ParseBool: parsing {}: invalid syntax",
            go::quote(s)
        )
    })
}

/// Logging buffer sizes: Kubernetes quantities, kept as given.
pub(super) fn quantity_flag(s: &str) -> Result<String, String> {
    go::quantity_is_zero(s)
        .map(|_| s.to_string())
        .map_err(str::to_string)
}

/// One `--vmodule` value, as component-base reads it: `pattern=N` items, empty items skipped.
/// Returns the items, comma-joined.
pub(super) fn vmodule_flag(value: &str) -> Result<String, String> {
    let mut items = Vec::new();
    for item in value.split(',').filter(|item| !item.is_empty()) {
        let level = match item.split('=').collect::<Vec<_>>().as_slice() {
            [pattern, level] if !pattern.is_empty() && !level.is_empty() => *level,
            _ => {
                return Err(format!(
                    "{} does not have the pattern=N format",
                    go::quote(item)
                ))
            }
        };
        go::parse_level(level)
            .map_err(|err| format!("parsing verbosity in {}: {err}", go::quote(item)))?;
        items.push(item);
    }
    Ok(items.join(","))
}

/// One `--leader-election-labels` value, as csi-lib-utils reads it: every comma-separated
/// item (empty ones too) must be exactly `key:value`; any key, even empty, parses.
pub(super) fn labels_flag(value: &str) -> Result<BTreeMap<String, String>, String> {
    let mut labels = BTreeMap::new();
    for item in value.split(',') {
        let parts: Vec<&str> = item.split(':').collect();
        let [key, value] = parts.as_slice() else {
            return Err(format!("malformed item in list of labels: {item}"));
        };
        labels.insert((*key).to_string(), (*value).to_string());
    }
    Ok(labels)
}
