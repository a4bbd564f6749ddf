//! Go's text formats, byte for byte, for output and errors that must read as
//! the Go sidecar's do: quoting, `IsPrint`, float formatting. A leaf: it
//! imports nothing of the crate, so every layer may use it.
//!
//! Hand-written on purpose: no crate reproduces Go's `strconv` output exactly
//! (escapes by Go's Unicode tables, `'g'` exponent thresholds, encoding/json's
//! exponent clean-up), and the sidecar's logs and metrics are compared
//! byte for byte with upstream's (`tests/properties_go.rs` checks against Go).

pub mod float;
pub mod parse;
pub mod quantity;
pub mod quote;

pub use float::{go_float_e, go_float_g, go_json_float};
pub use quote::{go_quote, go_quote_bytes, go_quote_into};
