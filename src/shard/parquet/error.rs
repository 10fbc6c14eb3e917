//! Why a Parquet file, or a row of it, cannot be read as asked.

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParquetError {
    #[error("not a Parquet file: {why}")]
    NotParquet { why: String },
    #[error("Parquet footer is damaged: {why}")]
    Footer { why: String },
    #[error("Parquet footer is {bytes} bytes, over the limit of {max}")]
    FooterTooLarge { bytes: u64, max: u64 },
    #[error(
        "Parquet footer lists {chunks} column chunks (row groups x columns), over the {max} a \
         footer may: it is parsed whole into memory; write fewer, larger row groups \
         (pyarrow: row_group_size)"
    )]
    FooterTooManyChunks { chunks: u64, max: u64 },
    #[error("Parquet file uses {what}, which shardfeed does not read")]
    Unsupported { what: String },
    #[error("Parquet row group {group}, column {column}: {why}")]
    Pages {
        group: usize,
        column: String,
        why: String,
    },
    #[error("Parquet column {column:?} not found (wanted {wanted}); the file's columns: {found}")]
    MissingColumn {
        column: String,
        wanted: String,
        found: String,
    },
    #[error("Parquet column {column:?} is {found}; wanted {wanted}")]
    ColumnType {
        column: String,
        found: String,
        wanted: String,
    },
    #[error(
        "row {row}: its image has no bytes, only the path {path:?} (the images live outside \
         the file); shardfeed reads images embedded in Parquet files: embed them as \
         push_to_hub does (datasets: ds.with_format(\"arrow\").map(datasets.table.\
         embed_table_storage, batched=True) before to_parquet), or pack the image folder \
         with `shardfeed pack`"
    )]
    ImageNotEmbedded { row: u64, path: String },
    #[error(
        "row {row}: column {column:?} holds {bytes} bytes, over the request's max_field_bytes \
         of {max}"
    )]
    FieldTooLarge {
        row: u64,
        column: String,
        bytes: u64,
        max: u64,
    },
    #[error(
        "row group {group} needs {bytes} bytes in memory to read (compressed + 2 x \
         uncompressed of its columns, + {per_row} a row), over the limit of {limit} a reader \
         may hold (--max-member-bytes x 8); write smaller row groups (pyarrow: \
         row_group_size)"
    )]
    RowGroupTooLarge {
        group: usize,
        bytes: u64,
        limit: u64,
        /// The cost charged a row (`BYTES_PER_ROW`).
        per_row: u64,
    },
    #[error(
        "row group {group}: its string label column needs {bytes} bytes to read (compressed + \
         2 x uncompressed), over the {limit} the dataset's planning reads a label chunk with; \
         write smaller row groups, or integer labels with the class names in the file's \
         metadata (datasets' ClassLabel)"
    )]
    LabelChunkTooLarge {
        group: usize,
        bytes: u64,
        limit: u64,
    },
    #[error("Parquet reader: {0}")]
    Internal(String),
}

impl ParquetError {
    /// Not damage to the file: the request, or the file's schema, does not
    /// fit what the stream asks (FAILED_PRECONDITION, never skipped).
    pub fn is_precondition(&self) -> bool {
        matches!(
            self,
            Self::MissingColumn { .. }
                | Self::ColumnType { .. }
                | Self::ImageNotEmbedded { .. }
                | Self::FieldTooLarge { .. }
                | Self::RowGroupTooLarge { .. }
                | Self::LabelChunkTooLarge { .. }
                | Self::FooterTooManyChunks { .. }
                | Self::Unsupported { .. }
        )
    }
}
