//! XenStore wire protocol (`io/xs_wire.h`): codec, client and embedded server.
//!
//! - [`wire`]: the message codec — header view, typed request/response representations,
//!   path syntax, permissions and error names, a streaming frame decoder.

pub mod wire;
