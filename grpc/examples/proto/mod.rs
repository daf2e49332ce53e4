//! The generated code of `pay.v1` (`payments.proto`), for the examples, tests and benchmarks.
#![allow(dead_code, missing_docs, clippy::all)]

include!("pay.v1.rs");

/// The encoded `FileDescriptorSet` of `pay.v1`.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!("pay.v1.bin");
