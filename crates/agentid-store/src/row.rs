//! `row!`: a struct that sqlx decodes from a row by column name, field by field, as
//! `#[derive(sqlx::FromRow)]` would, without sqlx's proc-macro: that macro builds sqlx's
//! drivers a second time, for the host, in every first build. A row is written once: its
//! fields are its columns (`COLUMNS`, in order, for the queries), and they take the struct's
//! visibility.

/// Declares the struct, its `COLUMNS` and its `FromRow` for every backend whose rows decode its
/// field types. A first field marked `#[flatten]` is itself a row, decoded from the same columns
/// (and not in `COLUMNS`).
macro_rules! row {
    (@columns $first:ident $($rest:ident)*) => {
        concat!(stringify!($first) $(, ", ", stringify!($rest))*)
    };
    (@from_row $name:ident [$($flat:ident: $fty:ty)?] $($field:ident: $ty:ty),*) => {
        impl $name {
            /// Its columns, in the order of its fields.
            #[allow(dead_code)]
            pub(crate) const COLUMNS: &'static str = row!(@columns $($field)*);
        }

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
        #[flatten] $flat:ident : $fty:ty,
        $($(#[$fm:meta])* $field:ident : $ty:ty),* $(,)?
    }) => {
        $(#[$m])*
        $vis struct $name { $vis $flat: $fty, $($(#[$fm])* $vis $field: $ty),* }
        row!(@from_row $name [$flat: $fty] $($field: $ty),*);
    };
    ($(#[$m:meta])* $vis:vis struct $name:ident {
        $($(#[$fm:meta])* $field:ident : $ty:ty),* $(,)?
    }) => {
        $(#[$m])*
        $vis struct $name { $($(#[$fm])* $vis $field: $ty),* }
        row!(@from_row $name [] $($field: $ty),*);
    };
}
