//! What a service's protobuf descriptors say about its methods: which stream, and how idempotent each
//! is (`option idempotency_level = …`).

use std::collections::HashMap;

use prost::Message as _;
use samekey_runtime::grpc_status::IdempotencyLevel;

/// One method, as its `.proto` declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MethodInfo {
    /// The client streams its request, or the server its reply.
    pub streaming: bool,
    /// Its `idempotency_level` option.
    pub level: IdempotencyLevel,
}

/// The methods of one or more file descriptor sets (`tonic_prost_build`'s
/// `file_descriptor_set_path`, read back with `tonic::include_file_descriptor_set!`), by full method
/// name (`/pay.v1.Payments/Charge`).
#[derive(Debug, Clone, Default)]
pub struct Methods {
    by_path: HashMap<String, MethodInfo>,
}

/// A file descriptor set that does not decode.
#[derive(Debug, Clone)]
pub struct DescriptorError(String);

impl std::fmt::Display for DescriptorError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "not a protobuf FileDescriptorSet: {}", self.0)
    }
}

impl std::error::Error for DescriptorError {}

impl Methods {
    /// samekey's own methods (`samekey.v1.Receipts/Get`, `NO_SIDE_EFFECTS`).
    pub fn samekey() -> Methods {
        let mut methods = Methods::default();
        methods.set_level("/samekey.v1.Receipts/Get", IdempotencyLevel::NoSideEffects);
        methods
    }

    /// Adds the methods of an encoded `FileDescriptorSet`.
    pub fn add_descriptor_set(&mut self, encoded: &[u8]) -> Result<(), DescriptorError> {
        let set = prost_types::FileDescriptorSet::decode(encoded)
            .map_err(|e| DescriptorError(e.to_string()))?;
        for file in set.file {
            let package = file.package.unwrap_or_default();
            for service in file.service {
                let service_name = service.name.unwrap_or_default();
                let qualified = if package.is_empty() {
                    service_name
                } else {
                    format!("{package}.{service_name}")
                };
                for method in service.method {
                    let path = format!("/{qualified}/{}", method.name.unwrap_or_default());
                    let level = method
                        .options
                        .and_then(|o| o.idempotency_level)
                        .map(IdempotencyLevel::from_proto)
                        .unwrap_or_default();
                    let streaming = method.client_streaming.unwrap_or(false)
                        || method.server_streaming.unwrap_or(false);
                    self.by_path.insert(path, MethodInfo { streaming, level });
                }
            }
        }
        Ok(())
    }

    /// Sets (or overrides) one method's level.
    pub fn set_level(&mut self, path: &str, level: IdempotencyLevel) {
        self.by_path
            .entry(path.to_owned())
            .or_insert(MethodInfo {
                streaming: false,
                level,
            })
            .level = level;
    }

    /// Declares one method streaming.
    pub fn set_streaming(&mut self, path: &str) {
        self.by_path
            .entry(path.to_owned())
            .or_insert(MethodInfo {
                streaming: true,
                level: IdempotencyLevel::Unknown,
            })
            .streaming = true;
    }

    /// A method, when the descriptors name it.
    pub fn get(&self, path: &str) -> Option<MethodInfo> {
        self.by_path.get(path).copied()
    }
}
