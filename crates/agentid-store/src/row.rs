//! `row!`: a struct that sqlx decodes from a row by column name, field by field, as
//! `#[derive(sqlx::FromRow)]` would, without sqlx's proc-macro: that macro builds sqlx's
//! drivers a second time, for the host, in every first build.

/// Declares the struct and its `FromRow` for every backend whose rows decode its field types.
macro_rules! row {
    ($(#[$m:meta])* $vis:vis struct $name:ident {
        $($(#[$fm:meta])* $fvis:vis $field:ident : $ty:ty),* $(,)?
    }) => {
        $(#[$m])*
        $vis struct $name { $($(#[$fm])* $fvis $field: $ty),* }

        impl<'r, R: ::sqlx::Row> ::sqlx::FromRow<'r, R> for $name
        where
            &'r str: ::sqlx::ColumnIndex<R>,
            $($ty: ::sqlx::Decode<'r, R::Database> + ::sqlx::Type<R::Database>,)*
        {
            fn from_row(row: &'r R) -> Result<Self, ::sqlx::Error> {
                Ok($name { $($field: ::sqlx::Row::try_get(row, stringify!($field))?),* })
            }
        }
    };
}
