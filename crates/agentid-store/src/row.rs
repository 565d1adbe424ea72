//! `row!`: a struct that sqlx decodes from a row by column name, field by field, as
//! `#[derive(sqlx::FromRow)]` would, without sqlx's proc-macro: that macro builds sqlx's
//! drivers a second time, for the host, in every first build.

/// Declares the struct and its `FromRow` for every backend whose rows decode its field types.
/// A first field marked `#[flatten]` is itself a row, decoded from the same columns.
macro_rules! row {
    (@from_row $name:ident [$($flat:ident: $fty:ty)?] $($field:ident: $ty:ty),*) => {
        impl<'r, R: ::sqlx::Row> ::sqlx::FromRow<'r, R> for $name
        where
            &'r str: ::sqlx::ColumnIndex<R>,
            $($fty: ::sqlx::FromRow<'r, R>,)?
            $($ty: ::sqlx::Decode<'r, R::Database> + ::sqlx::Type<R::Database>,)*
        {
            fn from_row(row: &'r R) -> Result<Self, ::sqlx::Error> {
                Ok($name {
                    $($flat: <$fty as ::sqlx::FromRow<'r, R>>::from_row(row)?,)?
                    $($field: ::sqlx::Row::try_get(row, stringify!($field))?),*
                })
            }
        }
    };
    ($(#[$m:meta])* $vis:vis struct $name:ident {
        #[flatten] $flatvis:vis $flat:ident : $fty:ty,
        $($(#[$fm:meta])* $fvis:vis $field:ident : $ty:ty),* $(,)?
    }) => {
        $(#[$m])*
        $vis struct $name { $flatvis $flat: $fty, $($(#[$fm])* $fvis $field: $ty),* }
        row!(@from_row $name [$flat: $fty] $($field: $ty),*);
    };
    ($(#[$m:meta])* $vis:vis struct $name:ident {
        $($(#[$fm:meta])* $fvis:vis $field:ident : $ty:ty),* $(,)?
    }) => {
        $(#[$m])*
        $vis struct $name { $($(#[$fm])* $fvis $field: $ty),* }
        row!(@from_row $name [] $($field: $ty),*);
    };
}
