//! The daemon's bounds on what peers may make it hold, each refused (and counted) when
//! exceeded, never a crash. Connection limits are in `conn` (`ConnLimits::for_domain`):
//! 4 connections per node of the domain (at least 64) in all, 8 connections per source
//! address that have not said an accepted hello, and 10 s to say it. Imports in flight per
//! importer node are bounded in core (`node::DEFAULT_MAX_DESCRIBES_PER_PEER`, 4096).

/// HTTP/2 streams one peer connection may have open at once. A daemon's own traffic needs two
/// (the hello and the session, which carries every request); the rest is room for a peer
/// reconnecting on the same connection and for the per-request RPCs of older clients.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 256;
/// Largest HTTP/2 header list accepted.
pub const MAX_HEADER_LIST: u32 = 16 << 10;
/// Largest peer request accepted (a hello carries the node map: up to 65,536 entries of at most
/// 256 bytes would not fit, so a hello is bounded well before its fields are).
pub const MAX_PEER_REQUEST: usize = 4 << 20;
/// Largest frame accepted on a session this daemon dialled: the answers to its requests come
/// back on it, and a status row with reasons for the largest node map (65,536 entries, about
/// 100 bytes each) fits.
pub const MAX_SESSION_FRAME: usize = 16 << 20;
