//! A request's delivery that cannot be used.

/// A request's delivery could not be used; names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct DeliveryError {
    pub field: &'static str,
    pub message: String,
}
