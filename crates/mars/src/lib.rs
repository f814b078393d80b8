//! MARS (001): the pure cores of the multimedia-on-demand stream server.
//!
//! Everything here decides and nothing here acts: no system call, no thread, no clock
//! (time, where it matters, is a parameter). The server shell (`ictus-mars-server`)
//! does the I/O.
//!
//! | module | what |
//! | --- | --- |
//! | [`label`] | the volume's stripe table on disk (the paper's ccd) and the stripe map |
//! | [`drr`] | Deficit Round Robin over request classes, rounds sorted by position |
//! | [`admission`] | admission of streams from the volume's measured capability |
//! | [`range`] | HTTP byte ranges and `multipart/byteranges` |
//! | [`http`] | HTTP/1.1 request heads in, response plans out |
//! | [`hls`] | MPEG-TS indexing and HLS playlists with byte ranges |
//! | [`pace`] | a stream's sending schedule |
//! | [`readahead`] | how far a real-time stream reads ahead, from the measured device latency |
//! | [`fuzz`] | the checks of the fuzz targets, shared with the corpus replay |
#![deny(unsafe_code)]

pub mod admission;
pub mod drr;
pub mod fuzz;
pub mod hls;
pub mod http;
pub mod label;
pub mod pace;
pub mod range;
pub mod readahead;
