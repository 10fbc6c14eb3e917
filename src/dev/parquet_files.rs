//! Parquet files laid out as the Hugging Face `datasets` library writes
//! image datasets, for tests and benchmarks: an `image` struct of `bytes`
//! and `path`, an int64 `label`, the class names in the schema's
//! `huggingface` metadata.

use std::sync::Arc;

use parquet::basic::{Compression, GzipLevel, ZstdLevel};
use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{WriterProperties, WriterVersion};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;

/// One row: its image (`None`: a null image), the path the `Image`
/// feature records, and its label.
#[derive(Debug, Clone)]
pub struct Row {
    pub image: Option<Vec<u8>>,
    pub path: Option<String>,
    pub label: Option<i64>,
}

/// How a file is written.
#[derive(Debug, Clone)]
pub struct Layout {
    pub rows_per_group: usize,
    /// `none`, `snappy`, `zstd`, `gzip`, `lz4_raw` or `lz4`.
    pub codec: String,
    /// Dictionary-encoded pages where the writer finds them worth it.
    pub dictionary: bool,
    /// Data pages v2 (else v1).
    pub page_v2: bool,
    /// Written into the `huggingface` metadata as the label's `ClassLabel`.
    pub classes: Vec<String>,
    /// The label column holds the class names as strings.
    pub text_labels: bool,
    /// Write the class names into the `huggingface` metadata (a file
    /// exported from elsewhere has none).
    pub class_metadata: bool,
}

impl Default for Layout {
    /// As the Hub's image datasets: Snappy, 100 rows a group, v1 pages.
    fn default() -> Self {
        Self {
            rows_per_group: 100,
            codec: "snappy".into(),
            dictionary: true,
            page_v2: false,
            classes: Vec::new(),
            text_labels: false,
            class_metadata: true,
        }
    }
}

pub fn codec(name: &str) -> Result<Compression, String> {
    Ok(match name {
        "none" => Compression::UNCOMPRESSED,
        "snappy" => Compression::SNAPPY,
        "zstd" => Compression::ZSTD(ZstdLevel::default()),
        "gzip" => Compression::GZIP(GzipLevel::default()),
        "lz4_raw" => Compression::LZ4_RAW,
        // The deprecated LZ4 codec id, Hadoop-framed: what older Arrow wrote.
        "lz4" => Compression::LZ4,
        other => {
            return Err(format!(
                "codec {other:?}: none, snappy, zstd, gzip, lz4_raw or lz4"
            ))
        }
    })
}

/// The bytes of one Parquet file holding `rows`.
pub fn write(rows: &[Row], layout: &Layout) -> Result<Vec<u8>, String> {
    let label_type = if layout.text_labels {
        "optional binary label (STRING);"
    } else {
        "optional int64 label;"
    };
    let schema = format!(
        "message schema {{ optional group image {{ optional binary bytes; \
         optional binary path (STRING); }} {label_type} }}"
    );
    let schema = Arc::new(parse_message_type(&schema).map_err(|e| e.to_string())?);
    let names: Vec<String> = layout
        .classes
        .iter()
        .map(|c| serde_json::to_string(c).unwrap_or_default())
        .collect();
    let hf = format!(
        r#"{{"info": {{"features": {{"image": {{"_type": "Image"}}, "label": {{"names": [{}], "_type": "ClassLabel"}}}}}}}}"#,
        names.join(", ")
    );
    let props = WriterProperties::builder()
        .set_compression(codec(&layout.codec)?)
        .set_dictionary_enabled(layout.dictionary)
        .set_writer_version(if layout.page_v2 {
            WriterVersion::PARQUET_2_0
        } else {
            WriterVersion::PARQUET_1_0
        })
        .set_key_value_metadata(
            layout
                .class_metadata
                .then(|| vec![KeyValue::new("huggingface".into(), hf)]),
        )
        .build();
    let mut out = Vec::new();
    let mut writer =
        SerializedFileWriter::new(&mut out, schema, Arc::new(props)).map_err(|e| e.to_string())?;
    for group in rows.chunks(layout.rows_per_group.max(1)) {
        let mut row_group = writer.next_row_group().map_err(|e| e.to_string())?;
        let mut column = 0;
        while let Some(mut writer) = row_group.next_column().map_err(|e| e.to_string())? {
            let result = match column {
                0 => write_bytes(&mut writer, group.iter().map(|r| r.image.clone()), 2),
                1 => write_bytes(
                    &mut writer,
                    group.iter().map(|r| r.path.clone().map(String::into_bytes)),
                    2,
                ),
                _ if layout.text_labels => write_bytes(
                    &mut writer,
                    group.iter().map(|r| {
                        r.label
                            .and_then(|l| layout.classes.get(l as usize))
                            .map(|c| c.clone().into_bytes())
                    }),
                    1,
                ),
                _ => {
                    let values: Vec<i64> = group.iter().filter_map(|r| r.label).collect();
                    let levels: Vec<i16> =
                        group.iter().map(|r| i16::from(r.label.is_some())).collect();
                    writer
                        .typed::<Int64Type>()
                        .write_batch(&values, Some(&levels), None)
                        .map(drop)
                }
            };
            result.map_err(|e| e.to_string())?;
            writer.close().map_err(|e| e.to_string())?;
            column += 1;
        }
        row_group.close().map_err(|e| e.to_string())?;
    }
    writer.close().map_err(|e| e.to_string())?;
    Ok(out)
}

fn write_bytes(
    writer: &mut parquet::file::writer::SerializedColumnWriter<'_>,
    values: impl Iterator<Item = Option<Vec<u8>>>,
    present: i16,
) -> parquet::errors::Result<()> {
    let values: Vec<Option<Vec<u8>>> = values.collect();
    // The image struct itself is always present; a null member sits one
    // level below it.
    let levels: Vec<i16> = values
        .iter()
        .map(|v| if v.is_some() { present } else { present - 1 })
        .collect();
    let data: Vec<ByteArray> = values.into_iter().flatten().map(ByteArray::from).collect();
    writer
        .typed::<ByteArrayType>()
        .write_batch(&data, Some(&levels), None)
        .map(drop)
}
