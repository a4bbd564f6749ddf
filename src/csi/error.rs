//! The CSI client's error type, rendered the way Go's gRPC renders errors.
//!
//! `attachError.message` on a VolumeAttachment and upstream's logs carry Go's
//! `rpc error: code = <CodeName> desc = <message>` text, so tools and people
//! matching on it keep working when this sidecar replaces upstream.

use std::time::Duration;

use tonic::Code;

/// A failed CSI call or a failure to reach the driver at all.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The driver (or the transport) answered with a gRPC status.
    #[error("{0}")]
    Rpc(#[from] RpcStatus),
    /// `--csi-address` is neither an absolute path nor a `unix://` URL.
    #[error("invalid CSI address {address:?}: {reason}")]
    InvalidAddress {
        address: String,
        reason: &'static str,
    },
    /// No connection to the driver socket could be made in time.
    #[error("failed to connect to CSI driver at {address} within {timeout:?}: {last_error}")]
    ConnectTimeout {
        /// Socket path.
        address: String,
        timeout: Duration,
        last_error: String,
    },
    /// The driver socket refused us (EACCES): connecting needs write permission on it.
    #[error("{message}")]
    SocketPermissionDenied {
        /// The socket's owner and mode, our uid and gid, and the ways out.
        message: String,
    },
    /// `GetPluginInfo` returned an empty name.
    #[error("driver name is empty")]
    EmptyDriverName,
}

/// A gRPC status with Go's text form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rpc error: code = {} desc = {message}", go_code_name(*.code))]
pub struct RpcStatus {
    pub code: Code,
    /// The status message, verbatim.
    pub message: String,
}

impl RpcStatus {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// What Go's client reports when the call's own context deadline passes.
    pub fn deadline_exceeded() -> Self {
        Self::new(Code::DeadlineExceeded, "context deadline exceeded")
    }

    /// The numeric gRPC code, as stored in `VolumeError.errorCode`.
    pub fn code_number(&self) -> i32 {
        self.code as i32
    }
}

impl From<tonic::Status> for RpcStatus {
    fn from(status: tonic::Status) -> Self {
        Self::new(status.code(), status.message())
    }
}

/// Go's `codes.Code.String()`: the label value of `grpc_status_code`.
pub fn go_code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_renders_in_go_format() {
        let status = RpcStatus::new(Code::ResourceExhausted, "mock rpc error");
        assert_eq!(
            status.to_string(),
            "rpc error: code = ResourceExhausted desc = mock rpc error"
        );
        assert_eq!(status.code_number(), 8);
        assert_eq!(
            Error::from(status).to_string(),
            "rpc error: code = ResourceExhausted desc = mock rpc error"
        );
    }

    #[test]
    fn deadline_renders_like_a_go_context_deadline() {
        let status = RpcStatus::deadline_exceeded();
        assert_eq!(
            status.to_string(),
            "rpc error: code = DeadlineExceeded desc = context deadline exceeded"
        );
        assert_eq!(status.code_number(), 4);
    }

    #[test]
    fn cancelled_uses_gos_single_l_spelling() {
        assert_eq!(go_code_name(Code::Cancelled), "Canceled");
        assert_eq!(go_code_name(Code::Ok), "OK");
        assert_eq!(go_code_name(Code::Unauthenticated), "Unauthenticated");
    }
}
