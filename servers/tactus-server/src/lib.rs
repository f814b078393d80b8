//! The Tactus server.
