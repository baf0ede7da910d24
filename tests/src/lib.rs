//! Helpers shared by the end-to-end tests in `tests/tests/`.
