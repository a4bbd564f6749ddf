//! Admin API (HTTP/JSON, loopback only) to steer the mock while it runs.
//!
//! | request | effect |
//! |---|---|
//! | `GET /ledger` | all ledger entries, as a JSON array |
//! | `GET /faults` | the fault table |
//! | `PUT /faults/<Method>` | set a fault (body: `Fault` JSON) for e.g. `ControllerPublishVolume`; `raw` answers with hand-made bytes, `endless_tokens` pages ListVolumes forever |
//! | `DELETE /faults[/<Method>]` | clear one or all faults (releases hangs) |
//! | `GET /published`, `PUT /published` | read / replace the table `{volume: [node, ...]}` |
//! | `PUT /ready` | `{"ready": bool}`: what Probe answers |
//! | `DELETE /nodes/<node ID>` | with a profile: the cloud deletes that instance (ID percent-encoded); its attachments go with it |
//! | `GET /nodes/gone` | with a profile: the instances deleted so far |

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;

use crate::faults::Fault;
use crate::service::Driver;

/// CSI methods a fault can be set on.
const METHODS: [&str; 7] = [
    "Probe",
    "GetPluginInfo",
    "GetPluginCapabilities",
    "ControllerGetCapabilities",
    "ControllerPublishVolume",
    "ControllerUnpublishVolume",
    "ListVolumes",
];

/// Serves the admin API on `listener` forever.
pub async fn serve(listener: TcpListener, driver: Arc<Driver>) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(conn) => conn,
            Err(err) => {
                eprintln!("csi-mock-driver: admin accept failed: {err}");
                continue;
            }
        };
        let driver = Arc::clone(&driver);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let driver = Arc::clone(&driver);
                async move { Ok::<_, Infallible>(handle(req, &driver).await) }
            });
            if let Err(err) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                eprintln!("csi-mock-driver: admin connection failed: {err}");
            }
        });
    }
}

async fn handle(req: Request<Incoming>, driver: &Driver) -> Response<Full<Bytes>> {
    let method = req.method().clone();
    let path = req.uri().path().trim_end_matches('/').to_string();
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(err) => return reply(StatusCode::BAD_REQUEST, json!({"error": err.to_string()})),
    };
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match (method, segments.as_slice()) {
        (Method::GET, ["healthz"]) => reply(StatusCode::OK, json!({"ok": true})),
        (Method::GET, ["ledger"]) => reply(StatusCode::OK, Value::Array(driver.ledger.entries())),
        (Method::GET, ["faults"]) => reply(StatusCode::OK, json!(driver.faults.snapshot())),
        (Method::PUT, ["faults", name]) => {
            if !METHODS.contains(name) {
                return reply(
                    StatusCode::NOT_FOUND,
                    json!({"error": format!("unknown method {name}; one of {METHODS:?}")}),
                );
            }
            let fault: Fault = match serde_json::from_slice(&body) {
                Ok(f) => f,
                Err(err) => {
                    return reply(StatusCode::BAD_REQUEST, json!({"error": err.to_string()}))
                }
            };
            if let Err(err) = fault.validate() {
                return reply(StatusCode::BAD_REQUEST, json!({"error": err}));
            }
            driver.faults.set(name, fault);
            reply(StatusCode::OK, json!(driver.faults.snapshot()))
        }
        (Method::DELETE, ["faults"]) => {
            driver.faults.clear(None);
            reply(StatusCode::OK, json!({}))
        }
        (Method::DELETE, ["faults", name]) => {
            driver.faults.clear(Some(name));
            reply(StatusCode::OK, json!(driver.faults.snapshot()))
        }
        (Method::GET, ["published"]) => reply(StatusCode::OK, json!(driver.published().table())),
        (Method::PUT, ["published"]) => {
            match serde_json::from_slice::<BTreeMap<String, Vec<String>>>(&body) {
                Ok(table) => {
                    driver.published().replace(table);
                    reply(StatusCode::OK, json!(driver.published().table()))
                }
                Err(err) => reply(StatusCode::BAD_REQUEST, json!({"error": err.to_string()})),
            }
        }
        (Method::DELETE, ["nodes", node]) => match &driver.cloud {
            Some(cloud) => {
                let node = percent_encoding::percent_decode_str(node).decode_utf8_lossy();
                cloud.remove_node(&node);
                reply(StatusCode::OK, json!({"gone": cloud.gone_nodes()}))
            }
            None => no_profile(),
        },
        (Method::GET, ["nodes", "gone"]) => match &driver.cloud {
            Some(cloud) => reply(StatusCode::OK, json!({"gone": cloud.gone_nodes()})),
            None => no_profile(),
        },
        (Method::PUT, ["ready"]) => match serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v.get("ready").and_then(Value::as_bool))
        {
            Some(ready) => {
                driver.ready.store(ready, Ordering::SeqCst);
                reply(StatusCode::OK, json!({"ready": ready}))
            }
            None => reply(
                StatusCode::BAD_REQUEST,
                json!({"error": "body must be {\"ready\": bool}"}),
            ),
        },
        _ => reply(
            StatusCode::NOT_FOUND,
            json!({"error": format!("no route for {path}")}),
        ),
    }
}

/// Deleting instances needs a cloud to delete them from.
fn no_profile() -> Response<Full<Bytes>> {
    reply(
        StatusCode::CONFLICT,
        json!({"error": "no driver profile: start with --profile or --profile-file"}),
    )
}

fn reply(status: StatusCode, body: Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}
