//! The protobuf messages the views decode from: `proto/k8s_views.proto`
//! (Kubernetes' messages with only the fields the views keep), compiled by
//! `build.rs`.

#![allow(missing_docs, clippy::all, clippy::pedantic)]

tonic::include_proto!("k8s.views");
