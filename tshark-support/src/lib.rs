//! What the wire checks with Wireshark share (`iwarp-proto/tests/tshark.rs`, vrdma-tests'
//! `tests/interhost.rs`): a pcap writer for TCP connections ([`pcap`]) and running `tshark` on
//! the file ([`tshark`]). No workspace dependency, so the lowest crate's tests can use it.

pub mod pcap;
pub mod tshark;
