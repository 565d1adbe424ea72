//! Schemas of values that answers share, for the OpenAPI document.

use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
use utoipa::openapi::{RefOr, Schema};
use utoipa::{PartialSchema, ToSchema};

/// What every time in an answer is (`Millis` as the domain serializes it): the schema of the
/// fields that hold one.
pub(crate) struct Timestamp;

impl PartialSchema for Timestamp {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime)))
            .description(Some(
                "ISO 8601 UTC with milliseconds, e.g. 2026-11-22T09:49:06.123Z",
            ))
            .into()
    }
}

impl ToSchema for Timestamp {}
