//! A request's sample layout, checked: what else of each sample a stream
//! reads (fields, label key, TFRecord feature or Parquet column names),
//! bounded because
//! fields ride in every batch message.

use super::pb;
use super::status::ServiceError;
use crate::shard::parquet::ColumnNames;
use crate::shard::tfrecord::FeatureNames;
use crate::shard::{SampleLayout, DEFAULT_MAX_FIELD_BYTES, MAX_FIELDS, MAX_FIELD_BYTES};

/// The request's sample layout, checked: fields ride in every batch message,
/// so their number and size are bounded.
pub(super) fn sample_layout(wire: Option<&pb::SampleLayout>) -> Result<SampleLayout, ServiceError> {
    let Some(wire) = wire else {
        return Ok(SampleLayout::default());
    };
    let invalid = |field: &str, message: String| Err(ServiceError::invalid(field, message));
    if wire.fields.len() > MAX_FIELDS {
        return invalid(
            "layout.fields",
            format!(
                "layout.fields names {} fields; at most {MAX_FIELDS}",
                wire.fields.len()
            ),
        );
    }
    let mut fields = Vec::with_capacity(wire.fields.len());
    for name in &wire.fields {
        if name.is_empty() || name.len() > 128 {
            return invalid(
                "layout.fields",
                format!("layout.fields: {name:?} is not a field name (1 to 128 bytes)"),
            );
        }
        if fields.contains(name) {
            return invalid(
                "layout.fields",
                format!("layout.fields names {name:?} twice"),
            );
        }
        fields.push(name.clone());
    }
    let max_field_bytes = match u64::from(wire.max_field_bytes) {
        0 => DEFAULT_MAX_FIELD_BYTES,
        bytes if bytes > MAX_FIELD_BYTES => {
            return invalid(
                "layout.max_field_bytes",
                format!("layout.max_field_bytes {bytes} exceeds the maximum of {MAX_FIELD_BYTES}"),
            )
        }
        bytes => bytes,
    };
    let label_offset = wire.label_offset;
    if label_offset.unsigned_abs() > 1 << 31 {
        return invalid(
            "layout.label_offset",
            format!("layout.label_offset {label_offset} is outside +-2^31"),
        );
    }
    let defaults = FeatureNames::default();
    let feature = |name: &str, default: String| {
        if name.is_empty() {
            default
        } else {
            name.to_string()
        }
    };
    Ok(SampleLayout {
        fields,
        label_json_key: (!wire.label_json_key.is_empty()).then(|| wire.label_json_key.clone()),
        features: FeatureNames {
            image: feature(&wire.image_feature, defaults.image),
            label: feature(&wire.label_feature, defaults.label),
            key: feature(&wire.key_feature, defaults.key),
        },
        max_field_bytes,
        columns: ColumnNames {
            image: feature(&wire.image_feature, ColumnNames::default().image),
            label: feature(&wire.label_feature, ColumnNames::default().label),
            label_named: !wire.label_feature.is_empty(),
        },
        label_offset,
    })
}
