//! One row group's samples, from its projected column chunks' bytes.
//!
//! Pure and synchronous (the caller runs it off the async runtime: a row
//! group's pages are decompressed here). Each projected leaf column is read
//! whole through the `parquet` crate's page and column readers, which take
//! every codec, encoding and page version pyarrow and Spark write; the
//! definition levels tell a null from a value.

use std::collections::BTreeSet;
use std::sync::Arc;

use bytes::Bytes;
use parquet::column::page::PageReader;
use parquet::column::reader::ColumnReaderImpl;
use parquet::data_type::{
    BoolType, ByteArrayType, DataType, DoubleType, FloatType, Int32Type, Int64Type,
};
use parquet::file::serialized_reader::SerializedPageReader;
use parquet::schema::types::ColumnDescriptor;

use super::checked_pages::CheckedPages;
use super::chunk::ChunkBytes;
use super::classes::ClassNames;
use super::columns::{ImageColumn, LabelColumn, Projection, ValueKind};
use super::error::ParquetError;
use super::footer::Footer;

/// What one row group's rows are read with.
pub struct RowGroupInput<'a> {
    pub footer: &'a Footer,
    pub group: usize,
    /// The file's row number of the group's first row (a sample's key).
    pub first_row: u64,
    pub projection: &'a Projection,
    /// Each projected leaf column's chunk, as [`Projection::leaves`] lists
    /// them.
    pub chunks: Vec<(usize, ChunkBytes)>,
    /// The dataset's class names, for string labels and the label range.
    pub classes: &'a ClassNames,
    pub max_field_bytes: u64,
}

/// One row as read: a sample once the shard layer frames it.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Its row number in the file.
    pub key: String,
    /// The `Image` feature's path, where it has one.
    pub name: Option<String>,
    /// Its image bytes, or why it has none (a substituted sample).
    pub image: Result<Bytes, String>,
    pub label: RowLabel,
    pub fields: Vec<Option<Bytes>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowLabel {
    Missing,
    Value(i64),
    /// Outside the classes, or a string naming none of them.
    Invalid(String),
}

/// A column's values, one a row (`None`: null).
enum Values {
    Integers(Vec<Option<i64>>),
    Text(Vec<Option<String>>),
}

/// The rows `[from, to)` of the group (numbered within it), as samples.
/// A null or unrecognisable image is a damaged sample (substituted
/// downstream, counted and logged with file and row); a row whose image
/// has no bytes but a path is an error: its image lives outside the file.
pub fn read_rows(input: &RowGroupInput<'_>, from: u64, to: u64) -> Result<Vec<Row>, ParquetError> {
    let rows = input.footer.span(input.group)?.rows;
    let (image, path) = match input.projection.image {
        ImageColumn::Binary(column) => (column, None),
        ImageColumn::Struct { bytes, path } => (bytes, path),
    };
    let images = read_bytes(input, image, rows)?;
    let paths = path
        .map(|column| read_bytes(input, column, rows))
        .transpose()?;
    let labels = match input.projection.label {
        None => None,
        Some(LabelColumn::Integer { column, kind }) => {
            Some(Values::Integers(read_integers(input, column, kind, rows)?))
        }
        Some(LabelColumn::Text(column)) => Some(Values::Text(
            read_bytes(input, column, rows)?
                .into_iter()
                .map(|v| v.map(|b| String::from_utf8_lossy(&b).into_owned()))
                .collect(),
        )),
    };
    let fields = input
        .projection
        .fields
        .iter()
        .map(|&(column, kind)| read_field(input, column, kind, rows))
        .collect::<Result<Vec<_>, _>>()?;
    let mut samples = Vec::with_capacity(to.min(rows).saturating_sub(from) as usize);
    for row in from..to.min(rows) {
        let at = row as usize;
        let key = (input.first_row + row).to_string();
        let path = paths.as_ref().and_then(|p| p[at].clone());
        let name = path
            .as_ref()
            .filter(|p| !p.is_empty())
            .map(|p| String::from_utf8_lossy(p).into_owned());
        let label = match &labels {
            None => RowLabel::Missing,
            Some(values) => label_of(values, at, input.classes),
        };
        let mut fields_of_row = Vec::with_capacity(fields.len());
        for (i, values) in fields.iter().enumerate() {
            let value = values[at].clone();
            if let Some(value) = &value {
                if value.len() as u64 > input.max_field_bytes {
                    return Err(ParquetError::FieldTooLarge {
                        row: input.first_row + row,
                        column: input
                            .footer
                            .metadata
                            .file_metadata()
                            .schema_descr()
                            .column(input.projection.fields[i].0)
                            .path()
                            .string(),
                        bytes: value.len() as u64,
                        max: input.max_field_bytes,
                    });
                }
            }
            fields_of_row.push(value);
        }
        let image = match &images[at] {
            Some(bytes) if !bytes.is_empty() => Ok(bytes.clone()),
            _ => match &name {
                Some(path) => {
                    return Err(ParquetError::ImageNotEmbedded {
                        row: input.first_row + row,
                        path: path.clone(),
                    })
                }
                None => Err(format!("row {}: its image is null", input.first_row + row)),
            },
        };
        samples.push(Row {
            key,
            name,
            image,
            label,
            fields: fields_of_row,
        });
    }
    Ok(samples)
}

fn label_of(values: &Values, at: usize, classes: &ClassNames) -> RowLabel {
    match values {
        Values::Integers(labels) => match labels[at] {
            None => RowLabel::Missing,
            Some(label) if !classes.is_empty() && (label < 0 || label >= classes.len() as i64) => {
                RowLabel::Invalid(format!(
                    "label {label} is outside the dataset's {} classes",
                    classes.len()
                ))
            }
            Some(label) => RowLabel::Value(label),
        },
        Values::Text(labels) => match &labels[at] {
            None => RowLabel::Missing,
            Some(text) => match classes.index_of(text) {
                Some(index) => RowLabel::Value(index),
                None => RowLabel::Invalid(format!("{text:?} is none of the dataset's classes")),
            },
        },
    }
}

fn pages(
    input: &RowGroupInput<'_>,
    column: usize,
    descr: &ColumnDescriptor,
    rows: u64,
) -> Result<Box<dyn PageReader>, ParquetError> {
    let chunk = input
        .chunks
        .iter()
        .find(|(c, _)| *c == column)
        .map(|(_, chunk)| chunk.clone())
        .ok_or_else(|| ParquetError::Internal(format!("column {column} was not fetched")))?;
    let meta = input.footer.metadata.row_group(input.group).column(column);
    // What the row group was charged for (the budget and the row group
    // limit read the footer): pages that claim more, or a body that
    // expands past its page's claim, are refused before a decompressor
    // sizes a buffer by the claim. Headers that would keep the crate's
    // page reader looping are refused before it reads them.
    let charged = u64::try_from(meta.uncompressed_size()).unwrap_or(0);
    let codec = meta.compression();
    let mut claimed = 0u64;
    super::thrift_guard::check_page_headers(&chunk, |page| {
        claimed = claimed.saturating_add(page.decompressed);
        if claimed > charged {
            return Err(format!(
                "its pages claim at least {claimed} bytes decompressed, more than the {charged} \
                 the footer gives the column chunk"
            ));
        }
        super::expansion::check_page_body(&chunk, codec, page)
    })
    .map_err(|why| page_error(input, column, why))?;
    let reader = SerializedPageReader::new(Arc::new(chunk), meta, rows as usize, None)
        .map_err(|e| page_error(input, column, e))?;
    Ok(Box::new(CheckedPages::new(
        Box::new(reader),
        descr.max_def_level(),
        descr.max_rep_level(),
    )))
}

fn page_error(
    input: &RowGroupInput<'_>,
    column: usize,
    error: impl std::fmt::Display,
) -> ParquetError {
    ParquetError::Pages {
        group: input.group,
        column: input
            .footer
            .metadata
            .file_metadata()
            .schema_descr()
            .column(column)
            .path()
            .string(),
        why: error.to_string(),
    }
}

/// Every row's value of one leaf column, `None` where it is null.
fn read_column<T: DataType>(
    input: &RowGroupInput<'_>,
    column: usize,
    rows: u64,
) -> Result<Vec<Option<T::T>>, ParquetError>
where
    T::T: Clone,
{
    // The crate's page decoders are third-party code over untrusted bytes,
    // and some of them index without checking (a fuzzed page found one): a
    // panic there is a damaged page, named like any other.
    let read = std::panic::AssertUnwindSafe(|| read_column_pages::<T>(input, column, rows));
    std::panic::catch_unwind(read).unwrap_or_else(|_| {
        Err(page_error(
            input,
            column,
            "the page decoder failed on its bytes",
        ))
    })
}

fn read_column_pages<T: DataType>(
    input: &RowGroupInput<'_>,
    column: usize,
    rows: u64,
) -> Result<Vec<Option<T::T>>, ParquetError>
where
    T::T: Clone,
{
    let descr = input
        .footer
        .metadata
        .file_metadata()
        .schema_descr()
        .column(column);
    let max_def = descr.max_def_level();
    let pages = pages(input, column, &descr, rows)?;
    let mut reader = ColumnReaderImpl::<T>::new(descr, pages);
    let mut values: Vec<T::T> = Vec::new();
    let mut levels: Vec<i16> = Vec::new();
    let mut read = 0usize;
    while (read as u64) < rows {
        let (records, _, _) = reader
            .read_records(rows as usize - read, Some(&mut levels), None, &mut values)
            .map_err(|e| page_error(input, column, e))?;
        if records == 0 {
            break;
        }
        read += records;
    }
    if read as u64 != rows {
        return Err(page_error(
            input,
            column,
            format!("its pages hold {read} rows; the row group has {rows}"),
        ));
    }
    if max_def == 0 {
        return Ok(values.into_iter().map(Some).collect());
    }
    let present = levels.iter().filter(|&&level| level == max_def).count();
    if present != values.len() || levels.len() as u64 != rows {
        return Err(page_error(
            input,
            column,
            format!(
                "{} values for {present} non-null rows of {} levels",
                values.len(),
                levels.len()
            ),
        ));
    }
    let mut values = values.into_iter();
    Ok(levels
        .iter()
        .map(|&level| {
            if level == max_def {
                values.next()
            } else {
                None
            }
        })
        .collect())
}

/// The distinct names of a string label column in the row group (the
/// dataset's classes, when no list names them): `input.chunks` holds the
/// label column's chunk. Empty for integer labels.
pub fn label_names(input: &RowGroupInput<'_>) -> Result<BTreeSet<String>, ParquetError> {
    let Some(LabelColumn::Text(column)) = input.projection.label else {
        return Ok(BTreeSet::new());
    };
    let rows = input.footer.span(input.group)?.rows;
    Ok(read_bytes(input, column, rows)?
        .into_iter()
        .flatten()
        .map(|name| String::from_utf8_lossy(&name).into_owned())
        .collect())
}

fn read_bytes(
    input: &RowGroupInput<'_>,
    column: usize,
    rows: u64,
) -> Result<Vec<Option<Bytes>>, ParquetError> {
    // A copy per value: the crate's byte arrays hide their buffers, and a
    // sample's bytes must outlive the page they came in. A dictionary
    // value is copied once, however many rows name it: the crate hands
    // each row a clone of the dictionary's entry (the same bytes, at the
    // same address while `values` holds them), and a 512 KiB value named
    // by 5,000 rows was 2.5 GB of copies.
    let values = read_column::<ByteArrayType>(input, column, rows)?;
    let meta = input.footer.metadata.row_group(input.group).column(column);
    if meta.dictionary_page_offset().is_none() {
        return Ok(values
            .into_iter()
            .map(|value| value.map(|v| Bytes::copy_from_slice(v.data())))
            .collect());
    }
    let mut copied: std::collections::HashMap<(usize, usize), Bytes> =
        std::collections::HashMap::new();
    Ok(values
        .iter()
        .map(|value| {
            value.as_ref().map(|v| {
                let data = v.data();
                copied
                    .entry((data.as_ptr() as usize, data.len()))
                    .or_insert_with(|| Bytes::copy_from_slice(data))
                    .clone()
            })
        })
        .collect())
}

fn read_integers(
    input: &RowGroupInput<'_>,
    column: usize,
    kind: ValueKind,
    rows: u64,
) -> Result<Vec<Option<i64>>, ParquetError> {
    Ok(match kind {
        ValueKind::Int32 => read_column::<Int32Type>(input, column, rows)?
            .into_iter()
            .map(|v| v.map(i64::from))
            .collect(),
        _ => read_column::<Int64Type>(input, column, rows)?,
    })
}

/// An extra field's values as bytes: binary as it is, numbers as decimal
/// text (as a tar's `.cls` member holds them).
fn read_field(
    input: &RowGroupInput<'_>,
    column: usize,
    kind: ValueKind,
    rows: u64,
) -> Result<Vec<Option<Bytes>>, ParquetError> {
    fn text<T: ToString>(values: Vec<Option<T>>) -> Vec<Option<Bytes>> {
        values
            .into_iter()
            .map(|v| v.map(|v| Bytes::from(v.to_string())))
            .collect()
    }
    Ok(match kind {
        ValueKind::Bytes => read_bytes(input, column, rows)?,
        ValueKind::Int32 => text(read_column::<Int32Type>(input, column, rows)?),
        ValueKind::Int64 => text(read_column::<Int64Type>(input, column, rows)?),
        ValueKind::Float => text(read_column::<FloatType>(input, column, rows)?),
        ValueKind::Double => text(read_column::<DoubleType>(input, column, rows)?),
        ValueKind::Boolean => text(read_column::<BoolType>(input, column, rows)?),
    })
}

#[cfg(test)]
mod tests {
    /// Files written by the dev writer, which the image's build leaves out.
    #[cfg(feature = "dev")]
    mod written {
        use super::super::super::{footer, ChunkBytes, ColumnNames, Footer, Projection};
        use super::super::*;
        use crate::dev::parquet_files::{self, Layout, Row as FileRow};

        /// The image column's bytes of every row of a file's first row group.
        fn images(rows: &[FileRow], layout: &Layout) -> Vec<Bytes> {
            let data = parquet_files::write(rows, layout).unwrap();
            let size = data.len() as u64;
            let range = footer::metadata_range(&data, size).unwrap();
            let footer =
                Footer::parse(&data[range.start as usize..range.end as usize], size).unwrap();
            let schema = footer.metadata.file_metadata().schema_descr();
            let projection = Projection::resolve(schema, &ColumnNames::default(), &[]).unwrap();
            let chunks = projection
                .leaves()
                .into_iter()
                .map(|column| {
                    let r = footer.chunk_range(0, column).unwrap();
                    let bytes = Bytes::copy_from_slice(&data[r.start as usize..r.end as usize]);
                    (column, ChunkBytes::whole(r.start, bytes))
                })
                .collect();
            let input = RowGroupInput {
                footer: &footer,
                group: 0,
                first_row: 0,
                projection: &projection,
                chunks,
                classes: &ClassNames::default(),
                max_field_bytes: 1 << 20,
            };
            read_rows(&input, 0, rows.len() as u64)
                .unwrap()
                .into_iter()
                .map(|row| row.image.unwrap())
                .collect()
        }

        #[test]
        fn a_dictionary_value_is_copied_once_however_many_rows_name_it() {
            let (a, b) = (vec![1u8; 64 << 10], vec![2u8; 64 << 10]);
            let rows: Vec<FileRow> = (0..6)
                .map(|i| FileRow {
                    image: Some(if i % 2 == 0 { a.clone() } else { b.clone() }),
                    path: None,
                    label: Some(0),
                })
                .collect();
            let layout = Layout {
                dictionary: true,
                ..Layout::default()
            };
            let read = images(&rows, &layout);
            assert!(read.iter().step_by(2).all(|image| image[..] == a[..]));
            assert!(read
                .iter()
                .skip(1)
                .step_by(2)
                .all(|image| image[..] == b[..]));
            // Rows naming one value share one copy of it.
            let at = |i: usize| read[i].as_ptr();
            assert_eq!((at(0), at(0)), (at(2), at(4)));
            assert_eq!((at(1), at(1)), (at(3), at(5)));
            assert_ne!(at(0), at(1));
            // Plain pages: a copy each, as before.
            let plain = images(
                &rows,
                &Layout {
                    dictionary: false,
                    ..Layout::default()
                },
            );
            assert_ne!(plain[0].as_ptr(), plain[2].as_ptr());
            assert_eq!(plain[0], read[0]);
        }
    }
}
