fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A vendored protoc keeps the build free of system packages.
    std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    // One run for both packages: the pool's units carry the service's own
    // `Augmentation` and `CropBox`, so one table reads both wires.
    tonic_prost_build::configure()
        // Batch payloads are tens of MB: share the buffer instead of copying it.
        .bytes(".shardfeed.v1.Batch.images")
        // Extra fields come out of the shard as `Bytes`: sent without a copy.
        .bytes(".shardfeed.v1.FieldValues.values")
        // The decode pool's units: image bytes out and pixels back without a copy.
        .bytes(".shardfeed.pool.v1.UnitSample.data")
        .bytes(".shardfeed.pool.v1.DecodedUnit.pixels")
        // Reserves each message's exact size: no reallocation chain per batch.
        .codec_path("crate::proto::codec::SizedProstCodec")
        .compile_protos(
            &[
                "proto/shardfeed/v1/shardfeed.proto",
                "proto/shardfeed/v1/pool.proto",
            ],
            &["proto"],
        )?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
