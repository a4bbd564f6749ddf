//! Azure Disk (`kubernetes.io/azure-disk` → `disk.csi.azure.com`) and Azure
//! File (`kubernetes.io/azure-file` → `file.csi.azure.com`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, PersistentVolume, SecretReference};

use super::{spec_mut, TranslateError};

pub const DISK_DRIVER: &str = "disk.csi.azure.com";
pub const FILE_DRIVER: &str = "file.csi.azure.com";
const MANAGED: &str = "Managed";
const RESOURCE_GROUP_ANNOTATION: &str = "kubernetes.io/azure-file-resource-group";
const ACCOUNT_SECRET_PREFIX: &str = "azure-storage-account-";
const ACCOUNT_SECRET_SUFFIX: &str = "-secret";

pub fn translate_disk(pv: &mut PersistentVolume) -> Result<(), TranslateError> {
    let spec = spec_mut(pv);
    let Some(source) = spec.azure_disk.as_ref() else {
        return Ok(());
    };
    if let Some(kind) = source.kind.as_deref() {
        if !kind.eq_ignore_ascii_case(MANAGED) {
            return Err(TranslateError::AzureDiskKind(kind.to_owned()));
        }
    }
    let mut attributes = BTreeMap::from([("kind".to_owned(), MANAGED.to_owned())]);
    if let Some(caching) = &source.caching_mode {
        attributes.insert("cachingmode".to_owned(), caching.clone());
    }
    if let Some(fs_type) = &source.fs_type {
        attributes.insert("fstype".to_owned(), fs_type.clone());
    }
    let csi = CSIPersistentVolumeSource {
        driver: DISK_DRIVER.to_owned(),
        volume_handle: source.disk_uri.clone(),
        read_only: source.read_only,
        fs_type: source.fs_type.clone(),
        volume_attributes: Some(attributes),
        ..Default::default()
    };
    spec.azure_disk = None;
    spec.csi = Some(csi);
    Ok(())
}

pub fn translate_file(pv: &mut PersistentVolume) -> Result<(), TranslateError> {
    let name = pv.metadata.name.clone().unwrap_or_default();
    let resource_group = pv
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(RESOURCE_GROUP_ANNOTATION))
        .cloned()
        .unwrap_or_default();
    let spec = spec_mut(pv);
    let Some(source) = spec.azure_file.as_ref() else {
        return Ok(());
    };
    let account = storage_account(&source.secret_name).unwrap_or(&source.secret_name);
    let claim_namespace = || spec.claim_ref.as_ref().and_then(|c| c.namespace.clone());
    let namespace = source
        .secret_namespace
        .clone()
        .or_else(claim_namespace)
        .unwrap_or_default();
    if namespace.is_empty() {
        return Err(TranslateError::AzureFileNamespace);
    }
    let share = &source.share_name;
    let csi = CSIPersistentVolumeSource {
        driver: FILE_DRIVER.to_owned(),
        volume_handle: format!("{resource_group}#{account}#{share}#{name}#{namespace}"),
        read_only: source.read_only,
        volume_attributes: Some(BTreeMap::from([("sharename".to_owned(), share.clone())])),
        node_stage_secret_ref: Some(SecretReference {
            name: Some(source.secret_name.clone()),
            namespace: Some(namespace),
        }),
        ..Default::default()
    };
    spec.azure_file = None;
    spec.csi = Some(csi);
    Ok(())
}

/// The account in `azure-storage-account-<account>-secret`, found anywhere in
/// the name (leftmost start, greedy account: the last `-secret` after it on
/// the same line, as the library's `(.+)` does not cross a newline).
fn storage_account(secret_name: &str) -> Option<&str> {
    secret_name
        .match_indices(ACCOUNT_SECRET_PREFIX)
        .find_map(|(start, _)| {
            let from = start + ACCOUNT_SECRET_PREFIX.len();
            let line = secret_name[from..].split('\n').next().unwrap_or_default();
            // The last suffix is the greedy match; the account has at least one character.
            let end = line.rfind(ACCOUNT_SECRET_SUFFIX)?;
            (end > 0).then(|| &line[..end])
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn account_name_is_the_greedy_middle() {
        assert_eq!(
            storage_account("azure-storage-account-acc-secret"),
            Some("acc")
        );
        assert_eq!(
            storage_account("x-azure-storage-account-a-secret-b-secret-y"),
            Some("a-secret-b")
        );
        assert_eq!(storage_account("azure-storage-account--secret"), None);
        assert_eq!(storage_account("azure-storage-account---secret"), Some("-"));
        assert_eq!(storage_account("my-secret"), None);
        // Found by tests/properties_migration.rs: the account never spans a newline.
        assert_eq!(storage_account("azure-storage-account-\n-secret"), None);
        assert_eq!(
            storage_account("azure-storage-account-a\nazure-storage-account-b-secret"),
            Some("b")
        );
        assert_eq!(
            storage_account("azure-storage-account-a-secret\n-secret"),
            Some("a")
        );
    }
}
