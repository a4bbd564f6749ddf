//! [`Wire`]: a view as kube-runtime's watcher receives it, the one
//! `kube::Resource` among the compact types.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ClusterResourceScope;
use kube::runtime::reflector::Lookup;
use serde::de::Deserializer;
use serde::Deserialize;

/// A view as kube-runtime's watcher receives it.
///
/// `kube::runtime::watcher` builds on `Api<K>`, which needs `K:
/// kube::Resource`, whose `meta()` must lend a whole `ObjectMeta`; the watcher
/// reads the name and the resource version from it. This wrapper is that
/// `Resource`, and nothing else is: it carries a small `ObjectMeta` with just
/// those two fields beside the view, and the informers unwrap the view before
/// it reaches a store. Its only user is the watch.
#[derive(Clone, Debug)]
pub struct Wire<T> {
    pub(super) meta: ObjectMeta,
    /// The view, decoded once.
    pub view: T,
}

impl<T: Lookup> Wire<T> {
    /// `view` at the watch boundary.
    pub fn new(view: T) -> Self {
        let meta = ObjectMeta {
            name: Lookup::name(&view).map(Cow::into_owned),
            resource_version: Lookup::resource_version(&view).map(Cow::into_owned),
            ..ObjectMeta::default()
        };
        Self { meta, view }
    }
}

impl<'de, T> Deserialize<'de> for Wire<T>
where
    T: Deserialize<'de> + Lookup,
{
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        T::deserialize(deserializer).map(Self::new)
    }
}

/// The `Resource` of the k8s-openapi type the view stands for (its
/// [`Lookup`]); both views are of cluster-scoped kinds.
impl<T: Lookup<DynamicType = ()>> kube::Resource for Wire<T> {
    type DynamicType = ();
    type Scope = ClusterResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        T::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        T::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        T::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        T::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.meta
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.meta
    }
}
