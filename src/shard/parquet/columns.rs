//! Which leaf columns a stream reads of a Parquet file, from the column
//! names its layout gives: the projection. Everything else in the file is
//! never fetched.

use parquet::basic::{ConvertedType, LogicalType, Type as Physical};
use parquet::schema::types::{ColumnDescPtr, SchemaDescriptor};

use super::error::ParquetError;

/// The column names a stream reads by. The defaults are those of the
/// Hugging Face `datasets` library's image datasets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnNames {
    /// A binary column, or an `Image` struct of `bytes` and `path`.
    pub image: String,
    /// An integer column, or a string column mapped to class indices.
    pub label: String,
    /// Whether the label column was named (a named column must exist; the
    /// default one may be absent: the samples are then unlabelled).
    pub label_named: bool,
}

impl Default for ColumnNames {
    fn default() -> Self {
        Self {
            image: "image".into(),
            label: "label".into(),
            label_named: false,
        }
    }
}

/// Where a row's image is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageColumn {
    /// A top-level binary column.
    Binary(usize),
    /// An `Image` struct: its `bytes` leaf, and its `path` leaf if any
    /// (read to say why a row without bytes has no image).
    Struct { bytes: usize, path: Option<usize> },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueKind {
    Bytes,
    Int32,
    Int64,
    Float,
    Double,
    Boolean,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabelColumn {
    Integer {
        column: usize,
        kind: ValueKind,
    },
    /// Strings: a label is the index of its string in the dataset's classes.
    Text(usize),
}

/// The leaf columns one stream reads, by index into the file's schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Projection {
    pub image: ImageColumn,
    pub label: Option<LabelColumn>,
    /// The layout's extra fields, in its order.
    pub fields: Vec<(usize, ValueKind)>,
}

impl Projection {
    /// Resolves `names` and the layout's `fields` against `schema`; a
    /// missing or wrongly typed column is an error naming the column, the
    /// type found and the type wanted.
    pub fn resolve(
        schema: &SchemaDescriptor,
        names: &ColumnNames,
        fields: &[String],
    ) -> Result<Self, ParquetError> {
        let columns = schema.columns();
        let leaf = |path: &[&str]| {
            columns.iter().position(|c| {
                let parts = c.path().parts();
                parts.len() == path.len() && parts.iter().zip(path).all(|(a, b)| a == b)
            })
        };
        let image = match (leaf(&[&names.image]), leaf(&[&names.image, "bytes"])) {
            (Some(column), _) => {
                expect(&columns[column], &[ValueKind::Bytes], "binary")?;
                ImageColumn::Binary(column)
            }
            (None, Some(bytes)) => {
                expect(&columns[bytes], &[ValueKind::Bytes], "binary")?;
                ImageColumn::Struct {
                    bytes,
                    path: leaf(&[&names.image, "path"]),
                }
            }
            (None, None) => {
                return Err(missing(
                    schema,
                    &names.image,
                    "a binary column or an Image struct {bytes, path}",
                ))
            }
        };
        let label = match leaf(&[&names.label]) {
            Some(column) => {
                let descr = &columns[column];
                let kind = expect(
                    descr,
                    &[ValueKind::Int32, ValueKind::Int64, ValueKind::Bytes],
                    "an integer, or a string naming a class",
                )?;
                Some(match kind {
                    ValueKind::Bytes if is_text(descr) => LabelColumn::Text(column),
                    ValueKind::Bytes => {
                        return Err(wrong_type(descr, "an integer, or a string naming a class"))
                    }
                    kind => LabelColumn::Integer { column, kind },
                })
            }
            None => {
                // A label name over nested columns (a list, a struct) is no
                // label: taken for absent, every sample would go unlabelled
                // (-1) without a word.
                let nested = columns
                    .iter()
                    .find(|c| c.path().parts().first() == Some(&names.label));
                if let Some(nested) = nested {
                    return Err(wrong_type(nested, "an integer, or a string naming a class"));
                }
                if names.label_named {
                    return Err(missing(schema, &names.label, "an integer or string column"));
                }
                None
            }
        };
        let all = [
            ValueKind::Bytes,
            ValueKind::Int32,
            ValueKind::Int64,
            ValueKind::Float,
            ValueKind::Double,
            ValueKind::Boolean,
        ];
        let fields = fields
            .iter()
            .map(|name| {
                let path: Vec<&str> = name.split('.').collect();
                let column = leaf(&path)
                    .ok_or_else(|| missing(schema, name, "a column of bytes, text or numbers"))?;
                let kind = expect(&columns[column], &all, "bytes, text or a number")?;
                Ok((column, kind))
            })
            .collect::<Result<_, ParquetError>>()?;
        Ok(Self {
            image,
            label,
            fields,
        })
    }

    /// Every leaf column read, each once, in schema order.
    pub fn leaves(&self) -> Vec<usize> {
        let mut leaves = match self.image {
            ImageColumn::Binary(column) => vec![column],
            ImageColumn::Struct { bytes, path } => {
                [Some(bytes), path].into_iter().flatten().collect()
            }
        };
        leaves.extend(self.label.map(|label| match label {
            LabelColumn::Integer { column, .. } | LabelColumn::Text(column) => column,
        }));
        leaves.extend(self.fields.iter().map(|(column, _)| *column));
        leaves.sort_unstable();
        leaves.dedup();
        leaves
    }
}

fn kind_of(descr: &ColumnDescPtr) -> Option<ValueKind> {
    match descr.physical_type() {
        Physical::BYTE_ARRAY => Some(ValueKind::Bytes),
        Physical::INT32 => Some(ValueKind::Int32),
        Physical::INT64 => Some(ValueKind::Int64),
        Physical::FLOAT => Some(ValueKind::Float),
        Physical::DOUBLE => Some(ValueKind::Double),
        Physical::BOOLEAN => Some(ValueKind::Boolean),
        Physical::INT96 | Physical::FIXED_LEN_BYTE_ARRAY => None,
    }
}

/// The column's kind if it is one of `wanted` and holds one value a row.
fn expect(
    descr: &ColumnDescPtr,
    wanted: &[ValueKind],
    wanted_name: &str,
) -> Result<ValueKind, ParquetError> {
    match kind_of(descr) {
        Some(kind) if wanted.contains(&kind) && descr.max_rep_level() == 0 => Ok(kind),
        _ => Err(wrong_type(descr, wanted_name)),
    }
}

fn is_text(descr: &ColumnDescPtr) -> bool {
    matches!(descr.logical_type_ref(), Some(LogicalType::String))
        || descr.converted_type() == ConvertedType::UTF8
}

fn describe(descr: &ColumnDescPtr) -> String {
    let mut found = format!("{:?}", descr.physical_type());
    if let Some(logical) = descr.logical_type_ref() {
        found = format!("{found} ({logical:?})");
    }
    if descr.max_rep_level() > 0 {
        found = format!("a list of {found}");
    }
    found
}

fn wrong_type(descr: &ColumnDescPtr, wanted: &str) -> ParquetError {
    ParquetError::ColumnType {
        column: descr.path().string(),
        found: describe(descr),
        wanted: wanted.to_string(),
    }
}

fn missing(schema: &SchemaDescriptor, name: &str, wanted: &str) -> ParquetError {
    let mut found: Vec<String> = schema.columns().iter().map(|c| c.path().string()).collect();
    found.truncate(32);
    ParquetError::MissingColumn {
        column: name.to_string(),
        wanted: wanted.to_string(),
        found: found.join(", "),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use parquet::schema::parser::parse_message_type;

    use super::*;

    fn schema(message: &str) -> SchemaDescriptor {
        SchemaDescriptor::new(Arc::new(parse_message_type(message).unwrap()))
    }

    #[test]
    fn a_label_column_that_is_a_list_is_an_error_naming_it() {
        let listed = schema(
            "message m { required binary image; optional group label (LIST) { \
             repeated group list { optional int64 element; } } }",
        );
        let error = Projection::resolve(&listed, &ColumnNames::default(), &[]).unwrap_err();
        let ParquetError::ColumnType { column, found, .. } = &error else {
            panic!("{error:?}");
        };
        assert_eq!(column, "label.list.element");
        assert!(found.starts_with("a list of INT64"), "{found}");
        // Without a label column at all, the samples are unlabelled.
        let bare = schema("message m { required binary image; }");
        let projection = Projection::resolve(&bare, &ColumnNames::default(), &[]).unwrap();
        assert_eq!(projection.label, None);
    }
}
