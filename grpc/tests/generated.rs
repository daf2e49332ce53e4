//! The checked-in generated code is what `tonic-prost-build` makes of the protos today, so that a
//! user of samekey-grpc needs no `protoc`: regenerate with
//! `SAMEKEY_REGENERATE=1 cargo test -p samekey-grpc --test generated` (protoc from the system's
//! `protobuf-compiler`) after changing a `.proto`.

use std::path::{Path, PathBuf};

/// One protobuf package's generated files: where its `.proto` is and where its code is kept.
struct Generated {
    proto: &'static str,
    include: &'static str,
    kept_in: &'static str,
    package: &'static str,
    /// The generated client's `connect` (tonic's transport), for examples that dial an address.
    transport: bool,
}

const GENERATED: [Generated; 2] = [
    Generated {
        proto: "proto/samekey/v1/receipts.proto",
        include: "proto",
        kept_in: "src/generated",
        package: "samekey.v1",
        transport: false,
    },
    Generated {
        proto: "examples/proto/payments.proto",
        include: "examples/proto",
        kept_in: "examples/proto",
        package: "pay.v1",
        transport: true,
    },
];

fn manifest(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn protoc_present() -> bool {
    std::process::Command::new(std::env::var("PROTOC").unwrap_or_else(|_| "protoc".into()))
        .arg("--version")
        .output()
        .is_ok_and(|out| out.status.success())
}

#[test]
fn generated_code_is_current() {
    if !protoc_present() {
        println!("skipped: install protobuf-compiler (protoc) to check the generated gRPC code");
        return;
    }
    let regenerate = std::env::var_os("SAMEKEY_REGENERATE").is_some();
    for generated in GENERATED {
        let out = tempfile::tempdir().expect("a temporary directory");
        let descriptor = format!("{}.bin", generated.package);
        tonic_prost_build::configure()
            .build_transport(generated.transport)
            .emit_rerun_if_changed(false)
            .out_dir(out.path())
            .file_descriptor_set_path(out.path().join(&descriptor))
            .compile_protos(&[manifest(generated.proto)], &[manifest(generated.include)])
            .expect("protoc and tonic-prost-build generate the code");
        for file in [format!("{}.rs", generated.package), descriptor] {
            let made = std::fs::read(out.path().join(&file)).expect("a generated file");
            let kept_path = manifest(generated.kept_in).join(&file);
            if regenerate {
                std::fs::write(&kept_path, &made).expect("write the generated file");
                continue;
            }
            let kept = std::fs::read(&kept_path).unwrap_or_default();
            assert!(
                kept == made,
                "{} is not what {} generates today: run `SAMEKEY_REGENERATE=1 cargo test -p samekey-grpc --test generated`",
                kept_path.display(),
                generated.proto
            );
        }
    }
}
