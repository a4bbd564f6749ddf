//! How kube-runtime's store names the views: [`Lookup`] for [`CachedVa`] and
//! [`CachedPv`], as for the k8s-openapi types they stand for.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::runtime::reflector::Lookup;

use super::pv::CachedPv;
use super::va::CachedVa;

/// How kube-runtime's store names a view: by the type constants of the
/// k8s-openapi type it stands for, and the view's own metadata.
macro_rules! lookup_as {
    ($view:ty, $full:ty) => {
        impl Lookup for $view {
            type DynamicType = ();

            fn kind(_: &()) -> Cow<'_, str> {
                Cow::Borrowed(<$full as k8s_openapi::Resource>::KIND)
            }
            fn group(_: &()) -> Cow<'_, str> {
                Cow::Borrowed(<$full as k8s_openapi::Resource>::GROUP)
            }
            fn version(_: &()) -> Cow<'_, str> {
                Cow::Borrowed(<$full as k8s_openapi::Resource>::VERSION)
            }
            fn plural(_: &()) -> Cow<'_, str> {
                Cow::Borrowed(<$full as k8s_openapi::Resource>::URL_PATH_SEGMENT)
            }
            fn name(&self) -> Option<Cow<'_, str>> {
                self.meta.rest.name.as_deref().map(Cow::Borrowed)
            }
            fn namespace(&self) -> Option<Cow<'_, str>> {
                self.meta.rest.namespace.as_deref().map(Cow::Borrowed)
            }
            fn resource_version(&self) -> Option<Cow<'_, str>> {
                self.meta
                    .rest
                    .resource_version
                    .as_deref()
                    .map(Cow::Borrowed)
            }
            fn uid(&self) -> Option<Cow<'_, str>> {
                self.meta.rest.uid.as_deref().map(Cow::Borrowed)
            }
        }
    };
}

lookup_as!(CachedVa, VolumeAttachment);
lookup_as!(CachedPv, PersistentVolume);
