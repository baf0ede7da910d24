//! Unit tests of the software device.
