//! HTTP/1.x message heads for the `proxy` service: parsing, framing and
//! the header rewriting a forward proxy does (3proxy's proxy.c header
//! loop; RFC 9110 and RFC 9112).
//!
//! Everything here is pure: bytes in, values (and a rewritten head in a
//! caller's buffer) out. The service (`services::proxy`) does the IO.
//!
//! Invariants:
//! - A request whose body length could be read two ways (Content-Length
//!   and Transfer-Encoding, differing Content-Lengths, a Transfer-Encoding
//!   that does not end in `chunked`, obs-fold) is refused, never guessed:
//!   the proxy and the origin must always agree where a request ends, or a
//!   second request could be hidden inside the first's body and bypass the
//!   ACL (request smuggling).
//! - Hop-by-hop fields never cross the proxy: `Connection` and every field
//!   it names, `Proxy-Connection`, `Keep-Alive`, `TE`, `Trailer`, `Upgrade`
//!   (unless upgrading), `Proxy-Authorization`.
//! - Chunked bodies are relayed as they are; [`ChunkScanner`] only finds
//!   where they end.
//!
//! The parts, each importing only from the ones it needs (never from
//! here):
//! - `head`: the field limits, [`HeadError`], where a head ends, byte
//!   helpers.
//! - `framing`: [`Framing`], the smuggling rules (Content-Length,
//!   Transfer-Encoding, `Connection` lists, hop-by-hop fields), the
//!   [`ChunkScanner`].
//! - `fields`: writing fields and heads (`Host`, the absolute form,
//!   `Connection` of a response), Basic credentials and base64.
//! - `request`: [`RequestHead`], [`Rewrite`], [`parse_request`].
//! - `response`: [`ResponseHead`], [`parse_response`].
//! - `connect`: [`client_connect`], CONNECT to an HTTP parent.

mod connect;
mod fields;
mod framing;
mod head;
mod request;
mod response;

pub use connect::client_connect;
pub use fields::{
    absolute_form, basic_auth, basic_credentials, end_response_head, put_authority, with_field,
};
pub(crate) use fields::{base64_decode, base64_encode};
pub use framing::{ChunkScanner, Framing};
pub use head::{find_head_end, HeadError, MAX_HEADERS};
pub(crate) use request::parse_request_slots;
pub use request::{is_idempotent, parse_request, RequestHead, Rewrite};
pub(crate) use response::parse_response_slots;
pub use response::{parse_response, ResponseHead};
